package nl.kooi.example;

/** Subordinate id ranges, the arithmetic kooi's subids role relies on. */
public final class Ranges {
    private Ranges() {}

    /** True when [aStart, aStart+aCount) and [bStart, bStart+bCount) share an id. */
    public static boolean overlap(long aStart, long aCount, long bStart, long bCount) {
        if (aCount <= 0 || bCount <= 0) {
            throw new IllegalArgumentException("count must be positive");
        }
        return aStart < bStart + bCount && bStart < aStart + aCount;
    }

    /** The host uid that container uid {@code id} maps to under a rootless engine. */
    public static long hostUid(long runnerUid, long subStart, long id) {
        if (id < 0) {
            throw new IllegalArgumentException("negative id");
        }
        return id == 0 ? runnerUid : subStart + id - 1;
    }
}
