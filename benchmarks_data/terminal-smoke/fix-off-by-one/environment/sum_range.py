import sys


def sum_range(n):
    """Sum of the integers 1..n inclusive."""
    total = 0
    for i in range(1, n):
        total += i
    return total


if __name__ == "__main__":
    print(sum_range(int(sys.argv[1])))
