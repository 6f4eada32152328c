"""The window query of `orders_per_minute`, in Flink SQL on a local mini-cluster (PyFlink).

Usage: job.py ORDERS_JSONL

Reads the orders (JSON lines) as a bounded stream with the same watermark as infra/pipeline.toml
(created_at - 30 s), runs the 1-minute tumbling window by country, and prints each result row
(the `print` connector: `+I[window_start, window_end, country, orders, revenue]`).
"""

import sys

from pyflink.table import EnvironmentSettings, TableEnvironment


def main() -> None:
    path = sys.argv[1]
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.execute_sql(
        f"""
        CREATE TABLE orders (
            order_id STRING,
            customer_id STRING,
            amount DECIMAL(18, 2),
            currency STRING,
            country STRING,
            status STRING,
            created_at TIMESTAMP(3),
            WATERMARK FOR created_at AS created_at - INTERVAL '30' SECOND
        ) WITH (
            'connector' = 'filesystem',
            'path' = 'file://{path}',
            'format' = 'json',
            'json.timestamp-format.standard' = 'ISO-8601'
        )
        """
    )
    env.execute_sql(
        """
        CREATE TABLE windowed (
            window_start TIMESTAMP(3),
            window_end TIMESTAMP(3),
            country STRING,
            orders BIGINT,
            revenue DECIMAL(38, 2)
        ) WITH ('connector' = 'print')
        """
    )
    env.execute_sql(
        """
        INSERT INTO windowed
        SELECT window_start, window_end, country, COUNT(*) AS orders, SUM(amount) AS revenue
        FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTE))
        GROUP BY window_start, window_end, country
        """
    ).wait()


if __name__ == "__main__":
    main()
