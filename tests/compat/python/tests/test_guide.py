"""The fixture as the Testcontainers for Python getting-started guide writes it (its
requirements pin testcontainers 4.4.0): the module-level container, and the environment
filled straight from the getters. `get_exposed_port` returns a str up to 4.8 and an int
from the connection-mode rework on (os.environ refuses it there, with or without kooi):
run.sh runs this file for 4.4.0 only, test_store.py for every version."""

import os

import pytest
from app import store
from testcontainers.postgres import PostgresContainer

postgres = PostgresContainer("postgres:16-alpine")


@pytest.fixture(scope="module", autouse=True)
def setup(request):
    postgres.start()

    def remove_container():
        postgres.stop()

    request.addfinalizer(remove_container)
    os.environ["DB_CONN"] = postgres.get_connection_url()
    os.environ["DB_HOST"] = postgres.get_container_host_ip()
    os.environ["DB_PORT"] = postgres.get_exposed_port(5432)
    os.environ["DB_USERNAME"] = postgres.username
    os.environ["DB_PASSWORD"] = postgres.password
    os.environ["DB_NAME"] = postgres.dbname
    store.create_table()


@pytest.fixture(autouse=True)
def empty():
    store.clear()


def test_two_people():
    store.add("Ada", "ada@example.org")
    store.add("Grace", "grace@example.org")
    assert store.names() == ["Ada", "Grace"]


def test_one_person():
    store.add("Edsger", "edsger@example.org")
    assert store.names() == ["Edsger"]
