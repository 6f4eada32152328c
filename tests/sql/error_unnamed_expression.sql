-- refused: needs a name: write `… AS some_name`
SELECT amount * 2 FROM orders
