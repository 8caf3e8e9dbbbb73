"""Each guard on hand-made pairs: what it must catch, and paraphrases it must let through."""
import pytest

from engine.cache.analysis import analyse, canonical, stem
from engine.cache.guards import entity_guard, failed_guards, negation_guard, numbers_guard, order_guard


# ---- normalisation ----------------------------------------------------------------------------
@pytest.mark.parametrize("text, numbers", [
    ("Give me twenty-five ideas", [("25", "")]),
    ("in 3 million years", [("3000000", "year")]),
    ("It costs $1,200", [("1200", "usd")]),
    ("Heat it to 180°C", [("180", "celsius")]),
    ("180 degrees Celsius", [("180", "celsius")]),
    ("a 90 degree angle", [("90", "degree")]),
    ("the 3rd and the fourth item", [("3", "ord"), ("4", "ord")]),
    ("two hundred and six bones", [("206", "")]),
    ("a dozen eggs", [("12", "")]),
    ("Henry VIII had six wives", [("8", "ord"), ("6", "")]),
    ("I want to write C code", []),
])
def test_numbers_are_parsed_with_units(text, numbers):
    assert list(analyse(text).numbers) == numbers


def test_stemming_and_synonyms_unify_inflections():
    assert stem("running") == stem("run") == "run"
    assert stem("sorted") == stem("sorting") == stem("sort")
    assert stem("values") == stem("value")
    assert stem("string") == "string"  # not "str" + "ing"
    assert canonical("dictionaries") == canonical("dict")
    assert canonical("erase") == canonical("deleted") == canonical("remove")
    assert canonical("kilometres") == canonical("km")


def test_contractions_become_negations():
    assert analyse("Why doesn't it build?").negations == ("not",)
    assert analyse("It won't start and I can't log in").negations == ("not", "not")


# ---- numbers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [
    ("Give me three ideas for a party", "Give me seven ideas for a party"),
    ("What is 20% of 150?", "What is 30% of 150?"),
    ("How far is 5 km?", "How far is 5 miles?"),
    ("What was the first step?", "What was the second step?"),
    ("Name three rivers", "Name a few rivers"),
])
def test_numbers_guard_catches_different_numbers(a, b):
    assert numbers_guard(a, b) is not None


@pytest.mark.parametrize("a, b", [
    ("Give me three ideas for a party", "Give me 3 party ideas"),
    ("What is 20 percent of 150?", "Compute 20% of 150"),
    ("Convert 5 kilometres to miles", "Convert 5 km to miles"),
    ("What is 1,000 divided by 8?", "What is 1000 divided by 8?"),
])
def test_numbers_guard_accepts_same_numbers(a, b):
    assert numbers_guard(a, b) is None


# ---- negation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [
    ("Is it safe to swim after eating?", "Is it not safe to swim after eating?"),
    ("Make tea with sugar", "Make tea without sugar"),
    ("Which birds can fly?", "Which birds can never fly?"),
    ("Why does my test pass?", "Why doesn't my test pass?"),
    ("List the cities with a metro", "List the cities with no metro"),
])
def test_negation_guard_catches_flipped_meaning(a, b):
    assert negation_guard(a, b) is not None


def test_negation_guard_accepts_equivalent_negations():
    assert negation_guard("Why doesn't my build work?", "Why does my build not work?") is None
    assert negation_guard("Why won't it start?", "Why will it not start?") is None
    assert negation_guard("How do I bake bread?", "What's the way to bake bread?") is None


# ---- order ------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [
    ("Convert 20 meters to feet", "Convert 20 feet to meters"),
    ("Is Rust faster than Go?", "Is Go faster than Rust?"),
    ("Bus times from Madrid to Lisbon", "Bus times from Lisbon to Madrid"),
    ("What is 3 to the power of 4?", "What is 4 to the power of 3?"),
    ("How many cups are in a gallon?", "How many gallons are in a cup?"),
])
def test_order_guard_catches_swapped_relations(a, b):
    assert order_guard(a, b) is not None


@pytest.mark.parametrize("a, b", [
    ("How do I sort a list in Java?", "What's the way to sort a Java list?"),
    ("What is the difference between cats and dogs?", "What is the difference between dogs and cats?"),
    ("Convert 20 meters to feet", "What are 20 meters in feet?"),
    ("How do I undo a commit in git?", "How do I undo a git commit?"),
])
def test_order_guard_accepts_reworded_phrases(a, b):
    assert order_guard(a, b) is None


# ---- entities / key terms ---------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [
    ("How do I reverse an array in Go?", "How do I reverse a string in Go?"),
    ("Write a Ruby script that prints primes", "Write a Perl script that prints primes"),
    ("What is a binary tree?", "What is a binary heap?"),
    ("How do I sort a linked list?", "How do I sort a list?"),
    ("Explain the area of a circle", "Calculate the area of a circle"),
    ("What is the population of Spain?", "What is the population of Portugal?"),
])
def test_entity_guard_catches_different_terms(a, b):
    assert entity_guard(a, b) is not None


@pytest.mark.parametrize("a, b", [
    ("How do I delete a file in Bash?", "What's the way to remove a file in bash?"),
    ("Explain closures in Rust", "What is a closure in Rust?"),
    ("Calculate the area of a circle", "What is the area of a circle?"),
    ("Who wrote The Hobbit?", "Who is the author of The Hobbit?"),
    ("What are the largest lakes in Canada?", "Which lakes in Canada are the biggest?"),
])
def test_entity_guard_accepts_paraphrases(a, b):
    assert entity_guard(a, b) is None


def test_failed_guards_collects_every_reason():
    reasons = failed_guards("Convert 10 USD to GBP", "Convert 10 GBP to USD")
    assert any(r.startswith("numbers") for r in reasons) and any(r.startswith("order") for r in reasons)
    assert failed_guards("How do I rename a branch in git?", "How can I rename a git branch?") == []
