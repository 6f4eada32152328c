-- refused: not an equality of keys
SELECT o.order_id FROM orders o LEFT JOIN currency_rates r ON o.amount > r.rate_to_eur
