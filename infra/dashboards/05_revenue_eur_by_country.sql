-- title: Revenue in EUR by country (orders_clean: cancelled orders out, converted with currency_rates)
-- chart: bar
-- x: country
-- y: revenue_eur
-- The last 7 days only: Athena reads only those days' partitions.
SELECT
  country,
  count(*) AS orders,
  sum(amount_eur) AS revenue_eur
FROM orders_clean
WHERE created_at >= current_timestamp - INTERVAL '7' DAY
GROUP BY 1
ORDER BY 3 DESC, 1
