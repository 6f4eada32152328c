-- refused: Consider aliasing
SELECT order_id, order_id FROM orders
