package nl.kooi.compat;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.testcontainers.containers.PostgreSQLContainer;

/**
 * The Testcontainers for Java getting-started guide's test, as its readers write it: the
 * guide's image name, the container started and stopped around the class. kooi runs it
 * through the run's broker once per pinned client version (run.sh). No registry is
 * reachable here: the test tags the local PostgreSQL image as postgres:16-alpine first.
 */
class CustomerServiceTest {
    static PostgreSQLContainer<?> postgres = new PostgreSQLContainer<>("postgres:16-alpine");

    CustomerService customerService;

    @BeforeAll
    static void beforeAll() {
        postgres.start();
    }

    @AfterAll
    static void afterAll() {
        postgres.stop();
    }

    @BeforeEach
    void setUp() throws Exception {
        customerService = new CustomerService(postgres.getJdbcUrl(), postgres.getUsername(), postgres.getPassword());
        customerService.deleteAllCustomers();
    }

    @Test
    void shouldGetCustomers() throws Exception {
        customerService.createCustomer(new CustomerService.Customer(1L, "George"));
        customerService.createCustomer(new CustomerService.Customer(2L, "John"));

        List<CustomerService.Customer> customers = customerService.getAllCustomers();
        assertEquals(Integer.getInteger("kooi.expected.customers", 2), customers.size());
    }
}
