-- Revenue per customer over every shard's orders that were not cancelled.
select
    c.customer_id,
    c.customer_name,
    count(o.order_key) as orders,
    coalesce(sum(o.quantity * p.price), 0) as revenue
from {{ ref('stg_customers') }} c
left join {{ ref('stg_orders') }} o
    on o.customer_id = c.customer_id and o.status <> 'cancelled'
left join {{ ref('stg_products') }} p
    on p.product_id = o.product_id
group by c.customer_id, c.customer_name
