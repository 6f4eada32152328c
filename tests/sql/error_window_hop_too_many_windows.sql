-- One record would open 86,400,000 windows per key.
-- refused: the limit is 1000 windows per record: use a longer slide (at least 86400 ms)
SELECT window_start, window_end, country, approx_distinct(customer_id) AS customers,
       COUNT(*) AS orders, AVG(amount) AS avg_amount
FROM TABLE(HOP(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MILLISECOND, INTERVAL '1' DAY))
GROUP BY window_start, window_end, country
