// Testcontainers for Go through the kooi broker: PostgreSQL in a nested container,
// reached as the getting-started guide does, at Host() (TESTCONTAINERS_HOST_OVERRIDE:
// engine.kooi.internal, the run network's gateway) and MappedPort(). The broker lists
// the run's network as the default bridge, so testcontainers-go puts its containers
// there (not on a network `reaper_default` of its own, whose published ports the
// gateway would not reach); see docs/testcontainers.md.
// Run by the testcontainers-go workflow (examples/workflows/testcontainers-go.yml) in
// the runner image's go variant; its modules come through the egress proxy's go preset.
package tcgo

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	_ "github.com/lib/pq"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func TestPostgresThroughTheBroker(t *testing.T) {
	ctx := context.Background()
	pg, err := testcontainers.Run(ctx, env("KOOI_POSTGRES_IMAGE", "kooi-postgres:17"),
		testcontainers.WithEnv(map[string]string{"POSTGRES_USER": "kooi", "POSTGRES_PASSWORD": "kooi-pw",
			"POSTGRES_DB": "shop"}),
		testcontainers.WithExposedPorts("5432/tcp"),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithOccurrence(2).WithStartupTimeout(2*time.Minute)),
	)
	testcontainers.CleanupContainer(t, pg)
	if err != nil {
		t.Fatal(err)
	}
	host, err := pg.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mapped, err := pg.MappedPort(ctx, "5432/tcp")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(mapped.Num())
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%s user=kooi password=kooi-pw dbname=shop "+
		"sslmode=disable connect_timeout=5", host, port))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := 0; ; i++ {
		if err = db.PingContext(ctx); err == nil || i == 30 {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"CREATE TABLE items (n integer NOT NULL)", "INSERT INTO items VALUES (40), (2)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var total int
	if err := db.QueryRowContext(ctx, "SELECT sum(n) FROM items").Scan(&total); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("KOOI-TC-GO host=%s port=%s total=%d\n", host, port, total)
	if want := env("KOOI_EXPECTED_SUM", "42"); fmt.Sprint(total) != want {
		t.Fatalf("sum %d, want %s", total, want)
	}
}
