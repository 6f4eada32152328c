-- title: Orders and revenue per minute, by country
-- chart: line
-- x: ts_minute
-- y: order_count, revenue
-- series: country
-- From the windowed table orders_per_minute (event-time minutes, closed windows, late records
-- corrected): its partial rows added up, as the view orders_per_minute does. The same SQL runs
-- in Athena (Trino) and in `streamtable query` (DataFusion).
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  window_start AS ts_minute,
  country,
  sum(orders) AS order_count,
  sum(revenue) AS revenue
FROM orders_per_minute_partials
WHERE window_start >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1, 2
ORDER BY 1, 2
