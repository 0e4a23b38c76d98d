select
    id as product_id,
    name as product_name,
    cast(price as decimal(12, 2)) as price
from {{ source('binlake', 'products_current') }}
