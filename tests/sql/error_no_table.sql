-- refused: reads a topic's table
SELECT 1 AS one
