package nl.kooi.example;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.testcontainers.containers.PostgreSQLContainer;
import org.testcontainers.junit.jupiter.Container;
import org.testcontainers.junit.jupiter.Testcontainers;
import org.testcontainers.utility.DockerImageName;

/**
 * Testcontainers-Java against a real PostgreSQL: run by the maven-testcontainers workflow,
 * where `kooi run` gives the build a kooi broker as its only engine socket. No registry is
 * reachable here, so the image is kooi-postgres, built from the locally bootstrapped Debian
 * base (images/testcontainers) and declared a compatible substitute for "postgres".
 */
@Tag("testcontainers")
@Testcontainers
class PostgresContainerTest {
    static final DockerImageName IMAGE = DockerImageName
            .parse(System.getProperty("kooi.postgres.image", "kooi-postgres:17"))
            .asCompatibleSubstituteFor("postgres");

    @Container
    static final PostgreSQLContainer<?> DB = new PostgreSQLContainer<>(IMAGE);

    @Test
    void rangesSurviveARoundTripThroughSql() throws Exception {
        // kooi.expected.sum lets a workflow turn this into a failing assertion on purpose
        // (tests/e2e check that a failing test fails the run).
        long expected = Long.getLong("kooi.expected.sum", 131172L);
        try (Connection c = DriverManager.getConnection(DB.getJdbcUrl(), DB.getUsername(), DB.getPassword());
                Statement s = c.createStatement()) {
            s.execute("CREATE TABLE ranges (start bigint NOT NULL, count bigint NOT NULL)");
            s.execute("INSERT INTO ranges VALUES (100000, 65536), (165536, 65536)");
            try (ResultSet rs = s.executeQuery("SELECT max(start + count) - min(start) + count(*) * 50 FROM ranges")) {
                rs.next();
                assertEquals(expected, rs.getLong(1));
            }
            try (ResultSet rs = s.executeQuery(
                    "SELECT count(*) FROM ranges a JOIN ranges b ON a.start < b.start AND a.start + a.count > b.start")) {
                rs.next();
                assertEquals(0, rs.getLong(1), "the ranges must not overlap");
                assertEquals(false, Ranges.overlap(100000, 65536, 165536, 65536));
            }
        }
    }
}
