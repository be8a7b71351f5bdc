"""A tiny data access layer in the shape of the Testcontainers for Python
getting-started guide: it reads where the database is from the environment, which the
test's fixture fills from what Testcontainers reports."""

import os

import psycopg


def connect():
    return psycopg.connect(
        host=os.getenv("DB_HOST", "localhost"), port=os.getenv("DB_PORT", "5432"),
        user=os.getenv("DB_USERNAME", "postgres"), password=os.getenv("DB_PASSWORD", "postgres"),
        dbname=os.getenv("DB_NAME", "postgres"))


def create_table():
    with connect() as conn:
        conn.execute("CREATE TABLE people (id serial PRIMARY KEY, name varchar NOT NULL, "
                     "email varchar NOT NULL UNIQUE)")


def add(name, email):
    with connect() as conn:
        conn.execute("INSERT INTO people (name, email) VALUES (%s, %s)", (name, email))


def names():
    with connect() as conn:
        return [row[0] for row in conn.execute("SELECT name FROM people ORDER BY id")]


def clear():
    with connect() as conn:
        conn.execute("DELETE FROM people")
