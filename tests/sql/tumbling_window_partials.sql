-- A window's table holds partial rows: an avg as its sum and count, approx_distinct as a sketch.
-- columns: window_start timestamp, window_end timestamp, country string, customers__hll string, orders long, avg_amount__sum double, avg_amount__count long
SELECT window_start, window_end, country, approx_distinct(customer_id) AS customers,
       COUNT(*) AS orders, AVG(amount) AS avg_amount
FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
GROUP BY window_start, window_end, country
