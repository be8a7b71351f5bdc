// Testcontainers for Node.js through the kooi broker: PostgreSQL started by the
// workload and reached at the host and published port Testcontainers reports (kooi
// sets TESTCONTAINERS_HOST_OVERRIDE to the run network's gateway). Run by the
// testcontainers-node workflow.
import { test } from "node:test";
import assert from "node:assert/strict";
import { GenericContainer, Wait } from "testcontainers";
import pg from "pg";

const IMAGE = process.env.KOOI_POSTGRES_IMAGE ?? "kooi-postgres:17";
const EXPECTED = Number(process.env.KOOI_EXPECTED_SUM ?? "42");

test("a query through PostgreSQL's published port", async () => {
  const db = await new GenericContainer(IMAGE)
    .withEnvironment({ POSTGRES_USER: "kooi", POSTGRES_PASSWORD: "kooi-pw", POSTGRES_DB: "shop" })
    .withExposedPorts(5432)
    .withWaitStrategy(Wait.forLogMessage(/database system is ready to accept connections/, 2))
    .start();
  try {
    const client = new pg.Client({
      host: db.getHost(), port: db.getMappedPort(5432), user: "kooi", password: "kooi-pw", database: "shop",
    });
    await client.connect();
    try {
      await client.query("CREATE TABLE items (n integer NOT NULL)");
      await client.query("INSERT INTO items VALUES (40), (2)");
      const { rows } = await client.query("SELECT sum(n)::int AS total FROM items");
      console.log(`KOOI-TC-NODE host=${db.getHost()} port=${db.getMappedPort(5432)} total=${rows[0].total}`);
      assert.equal(rows[0].total, EXPECTED);
    } finally {
      await client.end();
    }
  } finally {
    await db.stop();
  }
});
