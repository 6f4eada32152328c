-- refused: keep the topic's rows with an INNER or LEFT JOIN
SELECT o.order_id FROM orders o FULL JOIN currency_rates r ON o.currency = r.currency
