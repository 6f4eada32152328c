-- refused: currency_rates is a reference table
SELECT * FROM currency_rates
