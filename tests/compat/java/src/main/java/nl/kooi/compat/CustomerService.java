package nl.kooi.compat;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.List;

/** The getting-started guide's service: customers in a PostgreSQL table. */
public class CustomerService {
    public record Customer(long id, String name) {}

    private final String url;
    private final String user;
    private final String password;

    public CustomerService(String url, String user, String password) {
        this.url = url;
        this.user = user;
        this.password = password;
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement(
                "create table if not exists customers (id bigint not null, name varchar not null, primary key (id))")) {
            s.execute();
        } catch (SQLException e) {
            throw new IllegalStateException(e);
        }
    }

    private Connection connect() throws SQLException {
        return DriverManager.getConnection(url, user, password);
    }

    public void createCustomer(Customer customer) throws SQLException {
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement(
                "insert into customers (id, name) values (?, ?)")) {
            s.setLong(1, customer.id());
            s.setString(2, customer.name());
            s.execute();
        }
    }

    public List<Customer> getAllCustomers() throws SQLException {
        List<Customer> out = new ArrayList<>();
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement("select id, name from customers");
                ResultSet rs = s.executeQuery()) {
            while (rs.next()) {
                out.add(new Customer(rs.getLong("id"), rs.getString("name")));
            }
        }
        return out;
    }

    public void deleteAllCustomers() throws SQLException {
        try (Connection c = connect(); PreparedStatement s = c.prepareStatement("delete from customers")) {
            s.execute();
        }
    }
}
