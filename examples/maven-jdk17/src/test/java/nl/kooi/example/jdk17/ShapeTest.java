package nl.kooi.example.jdk17;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class ShapeTest {
    @Test
    void theTestsRunOnJava17() {
        System.out.println("KOOI-JDK feature=" + Runtime.version().feature());
        assertEquals(17, Runtime.version().feature());
    }

    @Test
    void areas() {
        assertEquals(4.0, new Shape.Square(2).area(), 1e-9);
        assertEquals(Math.PI, new Shape.Circle(1).area(), 1e-9);
    }
}
