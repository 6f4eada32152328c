-- title: Orders paid within the hour, by payment method
-- chart: bar
-- x: method
-- y: paid_orders, succeeded_attempts
-- From the interval join order_payments: one row per order and each payment attempted within
-- the hour after it (a payment attempted later is not a match, and a late row is a dead letter).
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  method,
  count(DISTINCT order_id) AS paid_orders,
  sum(CASE WHEN payment_status = 'succeeded' THEN 1 ELSE 0 END) AS succeeded_attempts
FROM order_payments
WHERE created_at >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1
ORDER BY 1
