-- title: Revenue in EUR by country (orders_clean: cancelled orders out, converted with currency_rates)
-- chart: bar
-- x: country
-- y: revenue_eur
SELECT
  country,
  count(*) AS orders,
  sum(amount_eur) AS revenue_eur
FROM orders_clean
GROUP BY 1
ORDER BY 3 DESC, 1
