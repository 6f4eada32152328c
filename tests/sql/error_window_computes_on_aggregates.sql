-- refused: computes on aggregates
SELECT window_start, window_end, country, approx_distinct(customer_id) + 1 AS customers,
       COUNT(*) AS orders, AVG(amount) AS avg_amount
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
