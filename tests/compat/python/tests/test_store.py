"""The same store against PostgreSQL for every pinned client version: the port as the
client reports it (str or int), the host by get_container_host_ip()."""

import os

import pytest
from app import store
from testcontainers.postgres import PostgresContainer


@pytest.fixture(scope="module", autouse=True)
def database():
    with PostgresContainer("postgres:16-alpine") as pg:
        os.environ.update(DB_HOST=pg.get_container_host_ip(), DB_PORT=str(pg.get_exposed_port(5432)),
                          DB_USERNAME=pg.username, DB_PASSWORD=pg.password, DB_NAME=pg.dbname)
        store.create_table()
        yield


def test_the_store_round_trips():
    store.clear()
    store.add("Ada", "ada@example.org")
    assert store.names() == ["Ada"]
