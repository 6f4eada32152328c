-- refused: subquery
-- at: SELECT max
SELECT order_id FROM orders WHERE amount > (SELECT max(amount) FROM payments)
