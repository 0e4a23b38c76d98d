select
    id as customer_id,
    name as customer_name,
    email,
    _source_ts as changed_at_ms
from {{ source('binlake', 'customers_current') }}
