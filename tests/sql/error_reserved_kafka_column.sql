-- refused: is reserved
SELECT kafka_offset + 1 AS kafka_offset FROM orders
