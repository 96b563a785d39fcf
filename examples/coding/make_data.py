"""Writes tasks.jsonl of the coding example: write one small function; the reward is the share of its
hidden tests passed in the sandbox (built-in reward `code_tests`). `python examples/coding/make_data.py`."""

import json
from pathlib import Path

SYSTEM = ("Write the Python function you are asked for. Reply with the complete code in one ```python block. "
          "You may run code first with the python tool:\n<tool_call>\n"
          '{"name": "python", "arguments": {"code": "print(1 + 1)"}}\n</tool_call>')

# (task statement, hidden tests): the statement names the function, its signature and one example
TASKS = [
    ("sum_digits(n: int) -> int: the sum of the decimal digits of n >= 0. sum_digits(123) == 6",
     ["assert sum_digits(0) == 0", "assert sum_digits(9) == 9", "assert sum_digits(1001) == 2",
      "assert sum_digits(987654321) == 45"]),
    (("is_palindrome(s: str) -> bool: whether s reads the same backwards, ignoring case and non-letters. "
     "is_palindrome('Abba') is True"),
     ["assert is_palindrome('A man, a plan, a canal: Panama')", "assert not is_palindrome('abc')",
      "assert is_palindrome('')", "assert is_palindrome('No lemon, no melon')"]),
    (("fizzbuzz(n: int) -> str: 'Fizz' for multiples of 3, 'Buzz' of 5, 'FizzBuzz' of both, else str(n). "
     "fizzbuzz(3) == 'Fizz'"),
     ["assert fizzbuzz(1) == '1'", "assert fizzbuzz(5) == 'Buzz'", "assert fizzbuzz(15) == 'FizzBuzz'",
      "assert fizzbuzz(98) == '98'", "assert fizzbuzz(99) == 'Fizz'"]),
    ("count_vowels(s: str) -> int: how many of a, e, i, o, u (either case) s holds. count_vowels('Hello') == 2",
     ["assert count_vowels('') == 0", "assert count_vowels('AEIOU') == 5", "assert count_vowels('rhythm') == 0",
      "assert count_vowels('Programming') == 3"]),
    ("second_largest(xs: list[int]) -> int: the second largest distinct value. second_largest([1, 3, 2]) == 2",
     ["assert second_largest([5, 5, 4]) == 4", "assert second_largest([-1, -2]) == -2",
      "assert second_largest([10, 9, 10, 8]) == 9", "assert second_largest([1, 2, 3, 4, 5]) == 4"]),
    ("gcd(a: int, b: int) -> int: the greatest common divisor of two positive integers. gcd(12, 18) == 6",
     ["assert gcd(7, 13) == 1", "assert gcd(100, 10) == 10", "assert gcd(21, 14) == 7", "assert gcd(1, 1) == 1"]),
    ("is_prime(n: int) -> bool: whether n is a prime number. is_prime(7) is True",
     ["assert not is_prime(1)", "assert is_prime(2)", "assert not is_prime(91)", "assert is_prime(97)",
      "assert not is_prime(0)"]),
    (("reverse_words(s: str) -> str: the words of s in reverse order, separated by single spaces. "
     "reverse_words('a b c') == 'c b a'"),
     ["assert reverse_words('hello world') == 'world hello'", "assert reverse_words('one') == 'one'",
      "assert reverse_words('  lots   of  space ') == 'space of lots'"]),
    (("flatten(xs: list) -> list: the elements of arbitrarily nested lists, in order. "
     "flatten([1, [2, [3]]]) == [1, 2, 3]"),
     ["assert flatten([]) == []", "assert flatten([[[]]]) == []", "assert flatten([1, [2, 3], [[4], 5]]) == [1, 2, 3, 4, 5]",
      "assert flatten(['a', ['b']]) == ['a', 'b']"]),
    (("run_length(s: str) -> str: run-length encoding, each run as the letter then its count. "
     "run_length('aaab') == 'a3b1'"),
     ["assert run_length('') == ''", "assert run_length('a') == 'a1'", "assert run_length('aabbbcc') == 'a2b3c2'",
      "assert run_length('abab') == 'a1b1a1b1'"]),
    (("fibonacci(n: int) -> int: the n-th Fibonacci number, fibonacci(0) == 0 and fibonacci(1) == 1. "
     "fibonacci(10) == 55"),
     ["assert fibonacci(0) == 0", "assert fibonacci(2) == 1", "assert fibonacci(20) == 6765",
      "assert fibonacci(90) == 2880067194370816120"]),
    (("anagrams(a: str, b: str) -> bool: whether a and b hold the same letters, ignoring case and spaces. "
     "anagrams('listen', 'silent') is True"),
     ["assert anagrams('Dormitory', 'dirty room')", "assert not anagrams('abc', 'abd')", "assert anagrams('', '')",
      "assert not anagrams('aab', 'ab')"]),
    (("max_subarray(xs: list[int]) -> int: the largest sum of a non-empty contiguous run of xs. "
     "max_subarray([1, -2, 3]) == 3"),
     ["assert max_subarray([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6", "assert max_subarray([-3, -1, -2]) == -1",
      "assert max_subarray([5]) == 5", "assert max_subarray([2, 2, -1, 2]) == 5"]),
    ("to_binary(n: int) -> str: n >= 0 in base 2, without a prefix. to_binary(5) == '101'",
     ["assert to_binary(0) == '0'", "assert to_binary(1) == '1'", "assert to_binary(255) == '11111111'",
      "assert to_binary(1024) == '10000000000'"]),
    (("word_count(s: str) -> dict[str, int]: how often each lower-cased word occurs. "
     "word_count('a A b') == {'a': 2, 'b': 1}"),
     ["assert word_count('') == {}", "assert word_count('x y x') == {'x': 2, 'y': 1}",
      "assert word_count('The the THE') == {'the': 3}"]),
    (("rotate(xs: list, k: int) -> list: xs rotated right by k places (k may exceed len(xs)). "
     "rotate([1, 2, 3], 1) == [3, 1, 2]"),
     ["assert rotate([1, 2, 3], 0) == [1, 2, 3]", "assert rotate([1, 2, 3], 4) == [3, 1, 2]",
      "assert rotate([], 3) == []", "assert rotate([1, 2, 3, 4], 2) == [3, 4, 1, 2]"]),
    ("balanced(s: str) -> bool: whether the brackets ()[]{} in s are balanced. balanced('([])') is True",
     ["assert balanced('')", "assert not balanced('(]')", "assert balanced('{[()()]}')", "assert not balanced('((')",
      "assert balanced('a(b)c')"]),
    (("unique_sorted(xs: list[int]) -> list[int]: the distinct values of xs in increasing order. "
     "unique_sorted([3, 1, 3]) == [1, 3]"),
     ["assert unique_sorted([]) == []", "assert unique_sorted([5, 4, 5, 4]) == [4, 5]",
      "assert unique_sorted([-1, 0, -1, 2]) == [-1, 0, 2]"]),
    (("digital_root(n: int) -> int: add the digits of n >= 0 repeatedly until one digit is left. "
     "digital_root(38) == 2"),
     ["assert digital_root(0) == 0", "assert digital_root(9) == 9", "assert digital_root(99999) == 9",
      "assert digital_root(123456) == 3"]),
    (("caesar(s: str, k: int) -> str: s with each letter shifted k places in the alphabet, keeping case; "
     "other characters unchanged. caesar('abc', 1) == 'bcd'"),
     ["assert caesar('xyz', 3) == 'abc'", "assert caesar('Hello, World!', 13) == 'Uryyb, Jbeyq!'",
      "assert caesar('abc', 26) == 'abc'", "assert caesar('Zz', 1) == 'Aa'"]),
    ("median(xs: list[float]) -> float: the median of a non-empty list. median([3, 1, 2]) == 2",
     ["assert median([1]) == 1", "assert median([4, 1, 3, 2]) == 2.5", "assert median([5, 5, 1]) == 5",
      "assert median([-1.5, 0.5]) == -0.5"]),
    (("common_prefix(words: list[str]) -> str: the longest prefix all words share. "
     "common_prefix(['flower', 'flow']) == 'flow'"),
     ["assert common_prefix(['dog', 'car']) == ''", "assert common_prefix(['a']) == 'a'",
      "assert common_prefix(['interview', 'internet', 'interval']) == 'inter'", "assert common_prefix([]) == ''"]),
    ("pascal_row(n: int) -> list[int]: row n of Pascal's triangle, row 0 being [1]. pascal_row(2) == [1, 2, 1]",
     ["assert pascal_row(0) == [1]", "assert pascal_row(1) == [1, 1]", "assert pascal_row(4) == [1, 4, 6, 4, 1]",
      "assert sum(pascal_row(10)) == 1024"]),
    ("roman(n: int) -> str: n between 1 and 3999 in Roman numerals. roman(4) == 'IV'",
     ["assert roman(1) == 'I'", "assert roman(9) == 'IX'", "assert roman(1994) == 'MCMXCIV'",
      "assert roman(3999) == 'MMMCMXCIX'"]),
]


def rows() -> list[dict]:
    out = []
    for statement, tests in TASKS:
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Write {statement}."}]
        out.append({"prompt": prompt, "tests": tests})
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("tasks.jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
