-- title: Orders paid within the hour, by payment method
-- chart: bar
-- x: method
-- y: paid_orders, succeeded_attempts
-- From the interval join order_payments: one row per order and each payment attempted within
-- the hour after it (a payment attempted later is not a match, and a late row is a dead letter).
SELECT
  method,
  count(DISTINCT order_id) AS paid_orders,
  sum(CASE WHEN payment_status = 'succeeded' THEN 1 ELSE 0 END) AS succeeded_attempts
FROM order_payments
GROUP BY 1
ORDER BY 1
