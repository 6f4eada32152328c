-- title: Orders by current status (the latest change of each order)
-- chart: bar
-- x: status
-- y: orders, order_value
-- From the upsert table orders_current: one row per order, its last status change (placed,
-- paid, shipped or cancelled); erased orders are gone. Deletes are applied by every reader.
SELECT
  status,
  count(*) AS orders,
  sum(amount) AS order_value
FROM orders_current
GROUP BY 1
ORDER BY 2 DESC
