import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from calc import mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_empty(self):
        with self.assertRaises(ValueError):
            mean([])

    def test_private_tmp_is_writable(self):
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"x")


if __name__ == "__main__":
    unittest.main()
