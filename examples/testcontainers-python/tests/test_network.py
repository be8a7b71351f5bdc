"""Testcontainers-Python through the kooi broker: a PostgreSQL container the workload
reaches directly, and a second container that reaches the first by name
on a Testcontainers Network. Run by the testcontainers-python workflow."""

import os
import unittest

import pg8000.native
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.postgres import PostgresContainer

IMAGE = os.environ.get("KOOI_POSTGRES_IMAGE", "kooi-postgres:17")
EXPECTED = os.environ.get("KOOI_EXPECTED_SUM", "42")


class NetworkOfTwo(unittest.TestCase):
    def test_a_client_container_reaches_postgres_by_name(self):
        with Network() as net:
            db = (PostgresContainer(IMAGE, username="kooi", password="kooi-pw", dbname="shop", driver=None)
                  .with_network(net).with_network_aliases("db"))
            with db:
                # The workload itself, at the address and port Testcontainers reports
                # (kooi sets TESTCONTAINERS_CONNECTION_MODE=bridge_ip: its own address).
                conn = pg8000.native.Connection("kooi", host=db.get_container_host_ip(),
                                                port=int(db.get_exposed_port(5432)),
                                                password="kooi-pw", database="shop")
                conn.run("CREATE TABLE items (n integer NOT NULL)")
                conn.run("INSERT INTO items VALUES (40), (2)")
                conn.close()
                # A second container on the same network, by the alias "db".
                client = (DockerContainer(IMAGE).with_network(net).with_env("PGPASSWORD", "kooi-pw")
                          .with_command(["psql", "-h", "db", "-U", "kooi", "-d", "shop", "-tAc",
                                         "SELECT sum(n) FROM items"]))
                client.start()
                try:
                    wrapped = client.get_wrapped_container()
                    status = wrapped.wait(timeout=120)["StatusCode"]
                    out = wrapped.logs().decode().strip()
                finally:
                    client.stop()
                self.assertEqual(status, 0, out)
                self.assertEqual(out, EXPECTED)


if __name__ == "__main__":
    unittest.main()
