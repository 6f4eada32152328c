-- refused: needs ON with equal keys
SELECT o.order_id FROM orders o CROSS JOIN currency_rates r
