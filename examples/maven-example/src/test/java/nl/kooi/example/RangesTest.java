package nl.kooi.example;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

class RangesTest {
    @ParameterizedTest
    @CsvSource({"100000,65536,165536,65536,false", "100000,65536,165535,10,true",
                "100000,1,100000,1,true", "0,10,10,10,false"})
    void overlap(long a, long ac, long b, long bc, boolean expected) {
        assertEquals(expected, Ranges.overlap(a, ac, b, bc));
        assertEquals(expected, Ranges.overlap(b, bc, a, ac));
    }

    @Test
    void rejectsEmptyRanges() {
        assertThrows(IllegalArgumentException.class, () -> Ranges.overlap(0, 0, 0, 1));
    }

    @Test
    void rootlessMapping() {
        assertEquals(1001, Ranges.hostUid(1001, 100000, 0));
        assertEquals(100999, Ranges.hostUid(1001, 100000, 1000));
    }

    @Test
    void workspaceIsWritable() throws Exception {
        Path f = Files.createTempFile(Path.of("target"), "kooi", ".txt");
        Files.writeString(f, "written by the workload");
        assertTrue(Files.exists(f));
        assertFalse(Files.readString(f).isEmpty());
    }
}
