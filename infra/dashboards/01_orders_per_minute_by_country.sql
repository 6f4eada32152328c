-- title: Orders and revenue per minute, by country
-- chart: line
-- x: ts_minute
-- y: order_count, revenue
-- series: country
-- The same SQL runs in Athena (Trino) and in `streamtable query` (DataFusion).
SELECT
  date_trunc('minute', created_at) AS ts_minute,
  country,
  count(*) AS order_count,
  sum(amount) AS revenue
FROM orders
GROUP BY 1, 2
ORDER BY 1, 2
