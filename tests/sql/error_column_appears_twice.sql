-- refused: appears twice
SELECT o.currency, r.currency FROM orders o JOIN currency_rates r ON o.currency = r.currency
