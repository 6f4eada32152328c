-- refused: use count, sum, min, max, avg or approx_distinct
SELECT window_start, window_end, country, median(amount) AS customers,
       COUNT(*) AS orders, AVG(amount) AS avg_amount
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
