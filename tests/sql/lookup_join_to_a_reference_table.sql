-- A lookup join: each order takes the rate of its currency when it is ingested.
-- columns: order_id string, amount decimal(18,2), amount_eur decimal(18,2)
SELECT o.order_id, o.amount, CAST(o.amount * r.rate_to_eur AS DECIMAL(18,2)) AS amount_eur
FROM orders o LEFT JOIN currency_rates r ON o.currency = r.currency
WHERE o.amount > 0
