package nl.kooi.example.jdk17;

/** Java 17's sealed interfaces and records: a release-17 build compiles them. */
public sealed interface Shape permits Shape.Square, Shape.Circle {
    double area();

    record Square(double side) implements Shape {
        public double area() {
            return side * side;
        }
    }

    record Circle(double radius) implements Shape {
        public double area() {
            return Math.PI * radius * radius;
        }
    }
}
