-- refused: one of the topics' tables or joins a reference table: orders, payments, readings, currency_rates
SELECT order_id FROM nowhere
