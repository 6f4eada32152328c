-- refused: aggregate without a window
-- at: sum(
SELECT sum(amount) AS s FROM orders
