"""Small word lists behind the pronoun → antecedent candidates (:mod:`.coref_pairs`).

spaCy's trimmed English pipeline gives number (``NNS``/``Number=Plur``) and the pronoun's own
gender (``Gender=Masc|Fem|Neut``), but not whether a *noun* names a person, nor the gender of
one, and its small NER model often misses given names (it tags "Marta" GPE and "Maria" ORG).
These lists fill that gap. They are deliberately small, closed and deterministic — a heuristic,
not a linguistic resource: a noun absent from them counts as a thing (``it``), a capitalised
name absent from them is a person only if spaCy's NER says ``PERSON`` (gender unknown).

Genders are ``"m"``, ``"f"`` or ``""`` (a person of either gender). Words are lower case,
singular (plural nouns only need to be plural: they/them/their take any plural noun).
"""

from __future__ import annotations

_MASCULINE = """
man boy gentleman guy brother father dad daddy son uncle nephew husband boyfriend groom
bridegroom widower grandfather grandpa granddad grandson stepfather king prince emperor duke
lord sir monk actor waiter host steward landlord
"""
_FEMININE = """
woman girl lady madam sister mother mom mum mummy daughter aunt niece wife girlfriend bride
widow grandmother grandma granny granddaughter stepmother queen princess empress duchess nun
actress waitress hostess stewardess landlady
"""
_EITHER = """
person human individual adult child kid baby toddler teenager parent grandparent sibling twin
cousin spouse partner friend neighbour neighbor roommate flatmate colleague classmate teammate
boss owner homeowner tenant guest visitor stranger passenger customer client patient
doctor nurse surgeon dentist vet physician paramedic pharmacist therapist teacher professor
tutor instructor student pupil coach mentor principal engineer mechanic technician plumber
electrician carpenter builder gardener farmer baker butcher cook chef driver pilot sailor
captain soldier officer guard detective judge lawyer attorney witness suspect victim thief
clerk cashier secretary assistant intern employee worker manager director editor author writer
poet painter singer dancer musician player runner athlete referee senator minister mayor
president governor politician diplomat ambassador librarian scientist researcher analyst
designer architect programmer developer reporter journalist photographer hero volunteer
keeper caretaker receptionist hiker climber swimmer rider
"""
#: Person nouns and their gender (see the module docstring for the suffix rules too).
PERSON_NOUNS: dict[str, str] = {
    **{w: "" for w in _EITHER.split()},
    **{w: "m" for w in _MASCULINE.split()},
    **{w: "f" for w in _FEMININE.split()},
}

#: Animals: referred to as ``it`` or, by owners and storytellers, ``he``/``she``.
_ANIMALS = """
dog puppy cat kitten horse pony bird parrot owl duck goose chicken sheep goat pig cow lion
tiger bear wolf fox mouse rabbit monkey elephant dolphin whale snake deer donkey
"""
ANIMALS: dict[str, str] = {
    **{w: "" for w in _ANIMALS.split()},
    "hen": "f", "mare": "f", "rooster": "m", "bull": "m", "stallion": "m",
}

#: Singular nouns for groups, which English also refers to as ``they``.
_COLLECTIVE = """
authority government company team family police committee council staff crew army band
audience jury board firm club class public
"""
COLLECTIVE_NOUNS = frozenset(_COLLECTIVE.split())

_NAMES_F = """
Ada Aisha Alice Amira Ana Anna Ann Anne Carmen Catherine Chloe Clara Elena Eleanor Elizabeth
Emily Emma Eva Fatima Grace Hannah Helen Ingrid Irene Isabel Jane Jessica Julia Kate Laura
Leila Lena Linda Lisa Lucia Lucy Margaret Maria Marie Marta Mary Mei Mia Nina Nora Olivia
Paula Priya Rachel Rebecca Rosa Ruth Sara Sarah Sofia Sophie Susan Vera Yuki Zoe
"""
_NAMES_M = """
Adam Ahmed Ali Andrew Ben Carlos Charles Daniel David Diego Eric Ethan Felix Frank George
Hans Harry Henry Hugo Ivan Jack Jacob James John Jonas Joseph Juan Karl Kenji Leo Liam
Lucas Luis Marco Mark Martin Matteo Max Michael Noah Omar Oliver Oscar Paul Pedro Peter Raj
Ravi Richard Robert Samuel Simon Stefan Thomas Tom Tomas Victor William
"""
_NAMES_EITHER = "Alex Ash Casey Charlie Chris Jamie Jordan Kim Morgan Riley Robin Sam Taylor"
#: A few given names and their gender (spaCy's small NER misses many, see above).
FIRST_NAMES: dict[str, str] = {
    **{w: "" for w in _NAMES_EITHER.split()},
    **{w: "m" for w in _NAMES_M.split()},
    **{w: "f" for w in _NAMES_F.split()},
}

#: Titles that make the next capitalised word a person of this gender.
TITLES: dict[str, str] = {"mr": "m", "mrs": "f", "ms": "f", "miss": "f", "dr": "",
                          "sir": "m", "lady": "f", "professor": ""}

_NOT_PERSON_IST = frozenset({"list", "wrist", "fist", "mist", "twist", "gist", "schist"})


def person_noun_gender(word: str) -> str | None:
    """Gender of a singular common noun naming a person (``"m"``, ``"f"``, ``""``), else None.

    Beyond :data:`PERSON_NOUNS`: ``-woman`` → f, ``-man`` → m (fisherman; not "human"),
    ``-ist``/``-ician`` → either (violinist, technician; not "list", "wrist", …)."""
    word = word.lower()
    if word in PERSON_NOUNS:
        return PERSON_NOUNS[word]
    if word.endswith("woman"):
        return "f"
    if word.endswith("man") and len(word) > 4 and word != "human":
        return "m"
    if (word.endswith("ist") and word not in _NOT_PERSON_IST) or word.endswith("ician"):
        return ""
    return None
