-- Orders come from two shard databases: (_source_db, id) is the key, never id alone.
select
    concat(_source_db, ':', cast(id as string)) as order_key,
    _source_db as shard,
    id as order_id,
    customer_id,
    product_id,
    quantity,
    status
from {{ source('binlake', 'orders_current') }}
