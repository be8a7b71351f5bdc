// Testcontainers for Go through the kooi broker: PostgreSQL in a nested container,
// reached at its own address on its network (ContainerIP, the workload is on every
// network of the run). testcontainers-go puts its containers on a network of its own
// (reaper_default: the broker's listings show no default bridge), whose published ports
// the run network's gateway (Host(), engine.kooi.internal) does not reach; see
// docs/testcontainers.md.
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
	host, err := pg.ContainerIP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	port := "5432"
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
