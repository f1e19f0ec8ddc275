"""The offline extractive answerer: answer-sentence selection over the retrieved passages.

No model, no download, deterministic. For each turn it

1. reads the *final* query (after the query transformers, so "Does it have a warranty?" arrives
   as "... Aurora X2") and the user's own question, and splits them into the **subject** (the
   names of products, people, policies... found in the passages' titles, headings and text)
   and the **attribute** asked about (the remaining content words of the clause that asks,
   widened by a synonym table: price/cost/how much, weigh/weight/heavy, warranty/guarantee/
   covered...); a question asking several things is answered part by part;
2. keeps only the sentences that are **on the subject**: a sentence naming another entity, or
   from a passage about another entity, is never used, even when it states the attribute;
3. scores each sentence by the share of the attribute it states (the asked words, their
   synonyms and its passage's heading as weaker evidence, so "Pricing" supports "$449"; a
   word nothing knows weighs less, as it is often a paraphrase), plus a bonus when it
   holds the kind of value asked for (an amount for "how much", a number for "how long"), with
   the retrieval rank as a prior so the first passage wins ties;
4. answers with the best sentence and the sentences right after it in the same passage that
   continue the same attribute (all prices, all sizes), each cited as ``[n]``; nothing else;
5. when no on-subject sentence states enough of the attribute, **declines plainly** and names
   what the documents do describe for that subject ("The documents don't say anything about
   water resistance for the Aurora X2. They describe the Aurora X2's charging, pricing and
   overview."), citing nothing.

Options (``RAGCHAT["PROFILES"][name]["options"]["extractive"]``): ``synonyms`` (extra groups,
merged into ``SYNONYMS``: ``{"sizes": ["fit", "small", "large"]}``), ``min_coverage`` (0.5, the
share of the asked attribute a sentence must state), ``max_sentences`` (4), ``no_answer`` (the
decline used when no passage was given at all). See docs/answerer.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from django_ragchat.subjects import kind_of
from django_ragchat.text import STOPWORDS, normalize, sentences
from django_ragchat.text import stem as _light_stem
from django_ragchat.types import Prompt, RetrievedChunk

#: The share of the asked attribute a sentence must state to be an answer (docs/answerer.md).
DEFAULT_MIN_COVERAGE = 0.5

# --- The synonym table --------------------------------------------------------------------------
#
# One group per attribute people ask about: a question word in a group asks for the whole group,
# and a sentence (or its heading) with any word of the group states it. Words are stemmed with
# text.stem, so list one form ("price" also matches prices, pricing, priced). Multi-word entries
# ("send back") are matched as phrases in the question; a two-word entry also matches its
# hyphenated form and back ("top up", "top-up"). The key is the group's name in declines
# ("... don't say anything about price") and in the synonyms expander's variant. A profile adds groups or words with the
# ``synonyms`` option; keep groups narrow: a wide group makes unrelated sentences look relevant.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "price": ("base model", "basic model", "entry model", "entry-level model", "starting model", "cheapest model",
              "cheapest one", "what's the total", "in total", "the total", "altogether", "all in", "entry price",
              "entry-level price", "starting at", "starts at", "pricy", "priciest", "on the hook for", "on the house",
              "what's the damage", "price", "cost", "costs", "expensive", "cheap", "cheapest", "lowest price",
              "starting price", "base price", "pricey", "afford", "affordable", "budget", "pay", "paid", "fee",
              "fees", "free", "money", "spend", "retail", "retails", "msrp", "charge for", "charge me", "charge you",
              "you charge", "they charge", "we charge", "charged for", "set me back", "sets me back", "go for",
              "goes for", "going for", "selling for", "sell for", "sells for", "price tag", "pricier", "overpriced",
              "costly", "inexpensive", "rrp", "list price", "asking price", "sticker price", "price point",
              "shell out", "fork out", "bucks", "dollars", "quid", "run me"),
    "weight": ("weight", "weigh", "weighs", "heavy", "heft", "hefty", "light", "lightweight", "grams", "gram", "kg",
               "kilograms", "ounces", "oz", "lb", "mass", "heavier", "heaviest", "lightest", "weighty",
               "featherweight", "kilo", "grammes"),
    "size": ("size", "sizes", "big", "large", "small", "compact", "inch", "inches", "dimensions", "diagonal",
             "measure", "measures", "fit", "bigger", "biggest", "larger", "largest", "smaller", "smallest", "bulky",
             "measurements", "footprint"),
    "warranty": ("take care of", "takes care of", "looked after", "die", "dies", "died", "stops working",
                 "stopped working", "stop working", "packs up", "gives out", "under warranty", "fixed under warranty",
                 "repaired under warranty", "replaced under warranty", "warranty", "guarantee", "guaranteed",
                 "covered", "cover", "covers", "coverage", "protect", "protected", "protection", "defect", "defects",
                 "defective", "faulty", "failure", "fail", "fails", "warrantee", "warrenty", "guaranty",
                 "manufacturing fault", "guarantee period", "stop holding", "stops holding", "stopped holding",
                 "won't hold", "wont hold"),
    "return": ("store credit", "credit note", "return", "returns", "returned", "send back", "send it back",
               "send them back", "bring back", "give back", "refund", "refunds", "refunded", "money back",
               "change my mind", "changed my mind", "take back", "take it back", "ship back", "ship it back",
               "mail back", "post back", "reimburse", "reimbursement", "returnable", "non-returnable", "dissatisfied",
               "not satisfied", "return window", "cooling off", "cooling-off"),
    "battery life": ("between top-ups", "between top-up", "between top ups", "between topups", "go between",
                     "keep going", "keeps going", "battery size", "play for", "plays for", "keep playing",
                     "play music", "music", "hours", "before i need to charge", "before i need to plug",
                     "before i have to charge", "before i have to plug", "before you need to charge",
                     "before you have to charge", "before needing to charge", "before it needs charging",
                     "before it needs a charge", "before recharging", "before charging", "before plugging", "battery",
                     "lasts", "last", "playback", "runtime", "battery life", "listening", "listen", "play time",
                     "playtime", "endurance", "juice", "run out", "runs out", "die", "dies", "hold a charge",
                     "holding a charge", "holds a charge", "single charge", "one charge", "full charge",
                     "between charges", "all day", "drain", "per charge", "on a charge", "stamina", "usage time",
                     "conk out", "mah", "battery capacity"),
    "charging": ("half a battery", "half my battery", "connector", "connectors", "connection port", "charging port",
                 "half battery", "half charged", "halfway", "to half", "get to half", "reach half", "charge",
                 "charges", "charging", "charger", "recharge", "recharging", "charged", "port", "plug", "usb",
                 "cable", "power", "socket", "outlet", "adapter", "watt", "watts", "top up", "topping up",
                 "topped up", "refill", "refuel", "juice up", "usb-c", "usb c", "type-c", "type c", "wattage", "cord",
                 "power brick", "wall plug", "mains power", "rechargeable", "charging stand", "half full",
                 "fully charged", "to full", "charge up"),
    # Narrower than charging: "wireless earbuds ... on one charge" says nothing of charging
    # without a cable, so "wireless" alone is in no group; the phrases are matched in sentences
    # too (Sentence.stems holds each pair of neighbouring words).
    "wireless charging": ("wirelessly", "wireless charging", "wireless charger", "wireless chargers",
                          "charge wirelessly", "charges wirelessly", "charged wirelessly", "charging wirelessly",
                          "wireless pad", "charging pad", "charging mat", "wireless mat", "qi", "qi charging",
                          "magsafe", "inductive charging", "induction charging", "cordless charging"),
    "water resistance": ("weather", "all weather", "weatherproof", "weather-resistant", "weather resistant",
                         "waterproof", "water", "rain", "rainy", "wet", "sweat", "sweaty", "sweatproof", "splash",
                         "splashes", "shower", "resistant", "resistance", "ipx4", "ip67", "ip68", "ipx7", "submerge",
                         "swim", "gym", "workout", "workouts", "exercise", "exercising", "jog", "jogging",
                         "splashproof", "splash-proof", "swimming", "pool", "underwater", "submersible", "dunk",
                         "spill", "liquid", "moisture", "dive", "diving", "ip55", "ip65", "ip66", "ipx6", "ipx8",
                         "drizzle", "downpour", "drenched", "soaked", "raining", "puddle", "puddles"),
    "length": ("length", "how long", "long", "tall", "short", "extend", "extends", "collapse", "collapses", "cm",
               "centimetres", "centimeters", "metres", "meters", "feet", "foot", "ft", "how tall", "telescopic",
               "extendable", "retractable", "collapsible", "lengthwise"),
    "duration": ("how long", "how soon", "how quickly", "how fast", "days", "hours", "minutes", "weeks", "years",
                 "within", "until", "soon", "when", "months", "turnaround", "lead time", "timeframe", "time frame",
                 "eta", "fortnight", "timeline", "wait time", "waiting time", "processing time", "how many days"),
    "speed": ("how quickly", "how fast", "how soon", "fast", "faster", "fastest", "quick", "quicker", "quickest",
              "quickly", "speed", "speedy", "slow", "minutes", "rapid", "rapidly", "hurry", "rush", "urgent",
              "urgently", "asap", "express", "expedite", "expedited", "overnight", "next day", "tomorrow", "swift",
              "speedier", "slower", "slowest", "promptly", "same day", "same-day", "next-day", "priority",
              "fast-track"),
    "shipping": ("turn up", "turns up", "show up", "shows up", "get to me", "gets to me", "reach me", "land", "lands",
                 "come through", "regular delivery", "normal delivery", "standard delivery", "package", "packages",
                 "standard shipping", "normal shipping", "regular shipping", "ship", "ships", "shipping", "shipped",
                 "delivery", "deliver", "delivered", "dispatch", "dispatched", "arrive", "arrives", "arrival",
                 "postage", "post", "mail", "mailed", "courier", "order", "orders", "send out", "sent out",
                 "get here", "warehouse", "go out", "goes out", "shipment", "parcel", "postal", "in transit",
                 "transit", "freight", "doorstep", "p&p", "s&h", "will it leave", "does it leave",
                 "leave your warehouse", "leave the warehouse"),
    "colour": ("colour", "colours", "color", "colors", "finish", "finishes", "shade", "shades", "colorway",
               "colourway", "hue", "black", "white", "blue", "red", "green", "pink", "grey", "gray", "purple",
               "yellow", "beige", "navy"),
    "discount": ("discount", "discounts", "save", "saving", "savings", "off", "cheaper", "deal", "deals", "reduced",
                 "reduction", "coupon", "promo", "promotion", "rebate", "lower", "less", "knock off", "money off",
                 "how much off", "much off", "percent off", "% off",
                 "on sale", "clearance", "markdown", "marked down", "voucher", "promo code", "promotional",
                 "special offer", "price drop", "price cut", "bargain", "cashback",
                 "cash back", "loyalty"),
    # An offer for some buyers only: "$200 off" for a trade-in is no student discount.
    "student discount": ("student", "students", "university", "college", "uni", "education", "educational",
                         "student card", "student id", "academic", "school", "pupil", "pupils", "teacher",
                         "teachers", "campus", "undergraduate", "graduate", "freshman", "nus card"),
    # A trade-in is its own offer: "Students get 10% off" is a discount, not a trade-in.
    "trade-in": ("credit", "trade-in credit", "trade-in value", "trade in", "trading in", "trade-in", "trade",
                 "trading", "traded", "hand in", "swap", "part exchange", "part-exchange", "trade up", "old phone",
                 "older phone", "trade my"),
    "display": ("screen", "display", "brightness", "bright", "nits", "glossy", "matte", "glare", "reflection",
                "reflections", "sunlight", "sun", "outdoors", "outside", "panel", "oled", "lcd", "touchscreen",
                "bezel", "brighter", "legible", "readable", "antiglare", "contrast", "shiny", "reflective", "reflect",
                "reflects"),
    "storage": ("storage", "gb", "gigs", "gig", "gigabytes", "tb", "memory", "capacity", "space", "room", "terabyte",
                "files", "room for files", "space for files", "storage space", "hold files"),
    "updates": ("updates", "update", "updated", "software support", "supported for", "be supported", "security",
                "secure", "patch", "patches", "patched", "vulnerability", "vulnerabilities", "software", "firmware",
                "upgrades", "os update", "ota", "over-the-air", "over the air", "bug fix", "bugfix", "security fix",
                "long-term support", "end of life", "obsolete", "outdated", "hackers", "hacker", "hacked", "hacking",
                "malware", "virus", "viruses", "exploits"),
    "carrier": ("mobile network", "mobile operator", "phone network", "cell network", "mobile provider", "carrier",
                "carriers", "unlocked", "locked", "network", "networks", "sim", "provider", "providers", "operator",
                "sim-free", "sim free", "prepaid", "postpaid", "pay as you go", "payg"),
    "included": ("came with", "come in the box", "accessories", "accessory", "cable", "cables", "included", "include",
                 "includes", "come with", "comes with", "in the box", "box", "bundled", "packaged", "ship with",
                 "ships with", "sold separately", "separately", "contents", "box contents", "supplied",
                 "supplied with", "packed with", "thrown in", "throw in", "in-box", "unboxing"),
    "condition": ("what state", "in what state", "state it's in", "good state", "accept it", "accept returns",
                  "perfect condition", "mint condition", "good as new", "original condition", "original state",
                  "in its original", "condition", "undamaged", "unopened", "opened", "unused", "sealed",
                  "original packaging", "mint", "scratched", "scratches", "scuffed", "wear and tear", "like new",
                  "as new", "pristine", "intact", "good condition", "working order", "tags"),
    "contact": ("contact", "customer service", "customer support", "support team", "support hours", "phone support",
                "helpline", "hotline", "call centre", "call center", "live chat", "email address", "phone number",
                "opening hours", "open hours", "business hours", "reach you", "get in touch", "speak to someone",
                "talk to someone"),
    "return shipping": ("covers the postage", "cover the postage", "pays the postage", "pay the postage",
                        "pay postage", "pays postage", "covers postage", "return shipping", "return postage",
                        "return label", "return labels", "returns label", "postage for returns", "return delivery",
                        "return fee", "returns fee", "restocking", "restocking fee", "return costs",
                        "cost of returning", "pay for the return", "pay for returns", "pays for returns",
                        "pays for the return"),
    "exchange": ("exchange", "exchanges", "exchanged", "swap it for", "swap for another", "replace it with another",
                 "different size", "different colour", "different color"),
    "order cancellation": ("cancel", "cancels", "canceled", "cancelled order", "order cancelled", "cancellation",
                           "cancel my order", "cancel an order", "cancel the order", "change my order",
                           "amend my order"),
    "loss": ("lose", "lost", "losing", "missing", "misplace", "misplaced", "replacement", "replace", "stolen",
             "theft", "left behind", "gone missing", "can't find"),
    "pressure": ("pressure", "levels", "sensitivity", "sensitive", "tilt", "angle", "force", "gradations",
                 "press harder", "line thickness", "line width", "stroke width", "shading", "pressure curve", "press",
                 "pressing", "press down"),
    "sensing": ("sense", "senses", "detect", "detects", "detection", "recognise", "recognize", "register", "notice",
                "notices", "pick up", "picks up", "respond", "responds", "responsive", "react", "recognition"),
    "repair": ("take a look", "have a look", "look at it", "cost up front", "price up front", "know the cost",
               "upfront", "up front", "in advance", "repair", "repairs", "repaired", "fix", "fixed", "fixing",
               "broken", "break", "breaks", "broke", "damaged", "cracked", "inspect", "inspection", "look at",
               "diagnose", "diagnosis", "quote", "estimate", "service", "servicing", "repairable", "fixable", "mend",
               "shatter", "smash", "busted", "technician", "repair shop", "service center", "service centre",
               "diagnostic"),
    "noise cancelling": ("noise", "cancelling", "cancel noise", "cancels noise", "cancel out noise", "cancel out",
                         "noise canceling", "noise cancellation", "anc", "quiet", "block out", "drown out",
                         "shut out", "cut out", "tune out", "noise-cancelling", "isolation", "isolate", "quieter",
                         "muffle", "block noise", "drown", "background sound"),
    # Watching, not filming: "hours of films" is the video playback a battery lasts.
    "video": ("video", "videos", "films", "movies", "movie", "shows", "series", "binge", "binging", "bingeing",
              "streaming", "stream", "netflix", "youtube", "watching", "watch"),
    "camera": ("footage", "video clips", "video clip", "4k video", "record video", "shoot video", "video recording",
               "ultra-hd", "ultra hd", "uhd", "how smooth", "smooth", "camera", "cameras", "photo", "photos",
               "picture", "pictures", "film", "filming", "record", "recording", "shoot", "lens", "mp", "megapixel",
               "megapixels", "fps", "frame rate", "pic", "pics", "shutter", "photography", "resolution"),
    "attachment": ("attach", "attaches", "attached", "magnet", "magnets", "magnetic", "magnetically", "clip", "clips",
                   "snap", "snaps", "stick", "sticks", "stow", "holder", "dock", "mount", "clasp", "hook", "latch",
                   "fasten", "detach", "detachable", "snap on", "stay on", "fall off"),
    "build": ("body", "chassis", "shell", "titanium", "frame", "made of", "material", "materials", "metal",
              "aluminium", "aluminum", "plastic", "build quality", "built from", "made from", "made out of", "steel",
              "stainless steel", "ceramic", "carbon fibre", "leather", "fabric", "rubber", "silicone", "wood",
              "recycled", "sturdy", "flimsy", "rugged", "durable", "durability", "plasticky"),
    "payment": ("payments", "pay monthly", "monthly payments", "payment plan", "instalment", "instalments",
                "installment", "installments", "financing", "finance", "buy now pay later", "bnpl", "split payment",
                "interest-free", "credit card", "debit card", "bank transfer", "cash on delivery", "gift card",
                "layaway", "paypal"),
    "compatibility": ("compatible", "compatibility", "incompatible", "pair with", "pair it with", "connect to",
                      "connect with", "connectivity", "bluetooth", "wifi", "wi-fi", "multipoint", "multi-point",
                      "sync"),
    "availability": ("in stock", "out of stock", "stock", "sold out", "back in stock", "restock", "pre-order",
                     "preorder", "backorder", "discontinued", "waitlist", "inventory", "where to buy", "stockist"),
}

# Entries matched as the exact word in a question, never by their stem in a sentence: the stem of
# "wirelessly" is "wireless", which "wireless earbuds" also has.
EXACT_WORDS = frozenset({"wirelessly"})

#: A question asking one of these groups is answered only by a sentence (or heading) stating it:
#: each narrows a broader attribute ("a student discount" is not any discount, "charging
#: wirelessly" not any charging), and the broader attribute's sentence is the usual wrong answer.
DECISIVE_GROUPS = frozenset({"wireless charging", "student discount", "return shipping"})

# How a question word reads in a decline ("... don't say anything about water resistance").
NOUN_OF: dict[str, str] = {
    "waterproof": "water resistance", "water": "water resistance", "resistant": "water resistance",
    "heavy": "weight", "weigh": "weight", "weighs": "weight", "cost": "price", "costs": "price",
    "expensive": "price", "cheap": "price", "pay": "price", "big": "size", "large": "size", "long": "length",
    "fast": "speed", "quick": "speed", "quickly": "speed", "last": "battery life", "lasts": "battery life",
    "charge": "charging", "colours": "colours", "colors": "colours", "color": "colour", "released": "release date",
    "release": "release date", "covered": "warranty",
}

# Words that judge or hedge what is asked ("a decent battery", "roughly how long", "the exact
# capacity"): no attribute of their own. The followup transformer reads them so too.
QUALIFYING_WORDS = frozenset("""decent great nice solid reasonable fine excellent strong poor bad awesome amazing
    impressive superb terrible roughly approximately approx exact exactly precise precisely ballpark till little tiny
    couple""".split())

# The words by which a person frames or relays a question ("Could you confirm...", "The caller
# wants to know...", "I was wondering...", a spoken "um", "so like"): they ask nothing themselves.
FRAMING_WORDS = frozenset("""confirm confirmed wondering wonder wondered caller callers customer customers client
    clients asks asking asked ask enquire enquiring enquiry inquire inquiring inquiry query curious clarify advise kindly
    please interested hoping hope request requesting regarding concerning colleague buyer expect expecting
    explain understand trying figure sure mind entitled entitle eligible eligibility qualify qualifies
    um umm uh uhh er erm hmm ah oh yeah yep kinda sorta gonna wanna gotta literally honestly anyway anyways
    alright lol pls plz thx cheers mate folks guys""".split())
# Question words that say nothing about what is asked ("What is the Nimbus Tab good for?").
GENERIC_WORDS = frozenset(
    """good kind type sort thing things way really actually exactly possible able like tell know
    happen happens happened anything something stuff okay ok hey hi thanks thank product products
    item items come comes available offer offered get getting else other interesting aspect aspects
    article notable significant important information info details detail more
    buy bought version option options keep use using need want wear go goes look looking lot lots
    phone phones handset smartphone tablet tablets earbuds earbud earphones earphone headphones buds
    device devices gadget gadgets owner owners maker manufacturer company brand
    still people person anyone someone everyone everything basically generally usually pretty quite bit
    pair pairs policy policies back one ones new just again stay stays times extra extras earpiece earpieces
    support supports take takes program programme scheme special particular specific whole entire current
    existing going cope handle survive withstand base basic meant intended designed purpose suited
    whats hows wheres whos dont doesnt cant wont isnt im ive entry whatever whichever already perfect
    problem problems issue issues actually""".split()
) | QUALIFYING_WORDS | FRAMING_WORDS
# The phrases that say what kind of value is asked ("how long", "how many") rather than what it
# is about: beside another asked word ("How long is its warranty?") they weigh this much of it.
ANSWER_TYPE_WEIGHT = 0.35
_ANSWER_TYPE_PHRASES = frozenset({("how", "long"), ("how", "many"), ("how", "much"), ("how", "soon"), ("how", "quickly"),
                                  ("how", "fast")})

# An amount: money, or nothing to pay ("Repairs under warranty are free"); or a share ("10% off").
_MONEY = r"[$€£¥]\s?\d|\d\s?(?:usd|eur|gbp|dollars|euros|pounds)\b|(?<![\w-])(?:free|at no cost|no charge)\b(?!-)"
_MONEY_RE = re.compile(_MONEY, re.IGNORECASE)
_CURRENCY_RE = re.compile(_MONEY + r"|\d\s?(?:%|percent\b)", re.IGNORECASE)
_NUMBER_RE = re.compile(
    r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
    r"forty|fifty|hundred|thousand|dozen|half)\b", re.IGNORECASE)
_QUANTITY_QUESTION_RE = re.compile(r"\bhow\s+(?:much|many|long|big|heavy|fast|far|old|often|large|bright|tall|"
                                   r"quickly|soon)\b|\bwhat\s+(?:size|length|weight|capacity)\b", re.IGNORECASE)
# "How much is it?", "how much does it cost", "how much to ship": a price. "How much storage",
# "how much RAM", "how much listening": a quantity of that noun. "How much does it weigh" is
# told apart by the measure asked (_MEASURE_GROUPS).
_PRICE_QUESTION_RE = re.compile(
    r"\bhow\s+much\b(?=\s*(?:$|[?.!,;]|(?:is|are|was|were|does|do|did|will|would|should|can|could|might|for|"
    r"it|they|them|that|this|these|those|extra|more|money|to|i|am|we|you)\b))", re.IGNORECASE)
# The words that open a question, for the clause asked ("I read in bed, is it heavy?").
_WH_WORDS = frozenset("what what's whats which how how's where when who whose why".split())
_POLAR_WORDS = frozenset("""is are am was were do does did can could will would should shall may might
    has have isn't aren't doesn't don't can't won't any""".split())
_CITE_BEFORE_STOP = re.compile(r"([.!?])$")
_MARKUP_CHARS = set('{}[]"=<>|`\\')
_NAME_TOKEN_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
_MAX_SCAN_CHARS = 4000


_POSSESSIVE_RE = re.compile(r"['’]s$")
# Groups that measure something else than money: "how much does it weigh" asks no price.
# What runs for a time: "its warranty length" is a duration.
_TIME_BEARING_GROUPS = frozenset({"warranty", "return", "shipping", "updates", "repair", "battery life"})
_MEASURE_GROUPS = frozenset({"weight", "size", "length", "duration", "storage", "battery life", "speed", "display"})


_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)  # as text.words


def _words(text: str) -> list[str]:
    """``text.words`` without possessive endings ("Aurora X2's" -> aurora, x2)."""
    return [_POSSESSIVE_RE.sub("", w) if "'" in w or "’" in w else w for w in _WORD_RE.findall(_fold(text))]


_LETTER_RE = re.compile(r"[^\W\d_]")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """``text.stem``, and a doubled final consonant undone ("swimming" -> "swimm" -> "swim",
    "shipped" -> "ship"), so a question's inflection meets the table's word. Only the answerer
    uses it: the embedder's features, and so the stored vectors, are not changed. An adverb
    meets its adjective ("diagonally" -> "diagonal", "magnetically" -> "magnetic", "monthly")."""
    if "-" in word:  # "trade-ins" is "trade-in"
        head, _, tail = word.rpartition("-")
        if tail.isalpha() and head:
            stemmed = stem(tail)
            if stemmed == tail and len(tail) >= 3 and tail.endswith("s") and not tail.endswith("ss"):
                stemmed = tail[:-1]  # "ins": too short for the light stemmer's plural rule
            return head + "-" + stemmed
    if len(word) > 5 and word.endswith("ly") and word.isalpha():
        word = word[:-4] + "ic" if word.endswith("ically") else word[:-2]
    s = _light_stem(word)
    if len(s) > 3 and s != word and s[-1] == s[-2] and s[-1] not in "aeiouylsz" and s[-1].isalpha():
        return s[:-1]
    return s


_GENERIC_STEMS = frozenset(stem(word) for word in GENERIC_WORDS)


def _stems(text: str, pairs: bool = False) -> frozenset[str]:
    """Stems of ``text``'s words, and of each part of a hyphenated one: "a 6.1-inch phone"
    states "inch" (a size), "two-year" states "year". With ``pairs``, also each two neighbouring
    words as one hyphenated stem, as the table stores its two-word phrases ("wireless charging"
    is "wireless-charg"), so a sentence states a phrase group only where it has the phrase."""
    found = set()
    words = _words(text)
    for word in words:
        found.add(stem(word))
        if "-" in word:
            found.update(stem(part) for part in word.split("-") if part)
    if pairs:
        found.update(stem(a + "-" + b) for a, b in zip(words, words[1:]) if "-" not in a + b)
    return frozenset(found)


def _fold(text: str) -> str:
    """``text.normalize`` with a fast path: ASCII text only needs lower-casing."""
    return text.lower() if text.isascii() else normalize(text)


def is_prose(sentence: str) -> bool:
    """False for code, JSON, tables and markup: quoting them is never a readable answer."""
    markup = sum(map(sentence.count, _MARKUP_CHARS))  # str.count runs in C, per character it doesn't
    letters = len(_LETTER_RE.findall(sentence))
    return markup / len(sentence) < 0.03 and letters / len(sentence) > 0.5


def cite(sentence: str, index: int) -> str:
    """``sentence`` with `` [index]`` before its final stop (the format the citations augmenter reads)."""
    if _CITE_BEFORE_STOP.search(sentence):
        return _CITE_BEFORE_STOP.sub(rf" [{index}]\1", sentence)
    return f"{sentence} [{index}]"


# --- Synonyms -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynonymTable:
    """The synonym groups, compiled: single words by stem, phrases by their word sequence."""

    groups: dict[str, frozenset[str]]  # label -> stems of its single words
    phrases: tuple[tuple[tuple[str, ...], str], ...]  # (words, "label|label"), longest first
    of_stem: dict[str, tuple[str, ...]]  # stem -> labels of the groups it is in
    phrases_from: dict[str, tuple[int, ...]] = field(default_factory=dict)  # first stem -> indexes in phrases
    # Each phrase's words stemmed, as a question's words are matched: "knocks off" is "knock off".
    stemmed: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def build(cls, extra: dict[str, Iterable[str]] | None = None) -> SynonymTable:
        if extra is not None and not isinstance(extra, dict):
            raise ValueError(f"synonyms must be a dict of group name -> list of words, not {extra!r}")
        merged: dict[str, list[str]] = {label: list(entries) for label, entries in SYNONYMS.items()}
        for label, entries in (extra or {}).items():
            if isinstance(entries, str) or not isinstance(entries, Iterable):
                raise ValueError(f"synonyms[{label!r}] must be a list of words, not {entries!r}")
            merged.setdefault(str(label), []).extend(str(e) for e in entries)
        groups: dict[str, set[str]] = {}
        phrase_labels: dict[tuple[str, ...], list[str]] = {}
        of_stem: dict[str, list[str]] = {}
        for label, entries in merged.items():
            stems = groups.setdefault(label, set())
            for entry in [label, *entries]:
                tokens = tuple(_words(entry))
                if len(tokens) == 1 and tokens[0] in EXACT_WORDS:
                    phrase_labels.setdefault(tokens, []).append(label)
                elif len(tokens) == 1:
                    stems.add(stem(tokens[0]))
                    if "-" in tokens[0]:  # "trade-in" is also written "trade in"
                        phrase_labels.setdefault(tuple(p for p in tokens[0].split("-") if p), []).append(label)
                elif tokens:  # a phrase may be in several groups ("how long": length, duration)
                    phrase_labels.setdefault(tokens, []).append(label)
                    if len(tokens) == 2:  # "top up" is also written "top-up"
                        stems.add(stem("-".join(tokens)))
        for label, stems in groups.items():
            for s in stems:
                of_stem.setdefault(s, []).append(label)
        phrases = sorted(((t, "|".join(dict.fromkeys(ls))) for t, ls in phrase_labels.items()),
                         key=lambda p: -len(p[0]))
        stemmed = tuple(tuple(stem(t) for t in tokens) for tokens, _label in phrases)
        phrases_from: dict[str, list[int]] = {}
        for index, tokens in enumerate(stemmed):
            phrases_from.setdefault(tokens[0], []).append(index)
        return cls({k: frozenset(v) for k, v in groups.items()}, tuple(phrases),
                   {k: tuple(v) for k, v in of_stem.items()}, {k: tuple(v) for k, v in phrases_from.items()},
                   stemmed)


_DEFAULT_TABLE: SynonymTable | None = None


def default_table() -> SynonymTable:
    """``SYNONYMS`` compiled once per process (profiles without a ``synonyms`` option share it)."""
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = SynonymTable.build()
    return _DEFAULT_TABLE


def table_for(profile) -> SynonymTable:
    """The table of a profile: ``SYNONYMS`` with its ``extractive`` ``synonyms`` option merged in.
    Build it once per component (the answerer, the ``synonyms`` expander, the ``followup``
    transformer read a question through the same table), never per turn."""
    synonyms = profile.options_for("extractive").get("synonyms")
    return SynonymTable.build(synonyms) if synonyms else default_table()


# --- Passages, sentences and entities -----------------------------------------------------------


@dataclass(frozen=True)
class Sentence:
    """One scorable sentence of a passage, with what scoring needs precomputed."""

    text: str
    position: int
    stems: frozenset[str]
    has_currency: bool
    has_number: bool
    names: tuple[str, ...]  # capitalised name runs it contains, folded ("aurora x2")
    sequence: tuple[frozenset[str], ...] = ()  # the stems at each word position, for proximity
    has_money: bool = False  # an amount of money ("$699", "free"), not only a share ("50%")


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk as the answerer sees it: its sentences, heading and subject."""

    index: int  # 1-based, as cited
    ordinal: int  # the chunk's place in its document: 0 is where a document describes its subject
    heading_leaf: str
    heading_stems: frozenset[str]
    subject_name: str  # display form of what the passage is about ("Aurora X2"), may be ""
    subject: tuple[str, ...]  # its folded tokens
    sentences: tuple[Sentence, ...]
    mentions_the: bool  # "the Aurora X2" appears: decline text uses the article
    kind: str = ""  # what its text defines the subject as ("tablet"), see subjects.kind_of


def _name_sequences(text: str) -> list[tuple[str, str]]:
    """(display, folded) capitalised name runs in ``text``: "Aurora X2", "Nimbus Pen", "Zappa".

    A run is capitalised words (and model codes like X2 right after one); a run of a single
    word counts only inside a sentence, since any sentence starts with a capital.
    """
    found = []
    tokens = list(_NAME_TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]))
    run: list[re.Match] = []

    def close():
        while run and _fold(run[0].group(0)) in STOPWORDS:
            run.pop(0)
        if run:
            first = run[0]
            starts = _sentence_start(text, first.start())
            if len(run) > 1 or not starts:
                display = text[run[0].start():run[-1].end()]
                found.append((display, " ".join(_fold(m.group(0)) for m in run)))
        run.clear()

    for m in tokens:
        token = m.group(0)
        adjacent = bool(run) and text[run[-1].end():m.start()].strip() == ""
        capital = token[:1].isupper() and any(c.islower() for c in token[1:]) if len(token) > 1 else False
        code = bool(run) and adjacent and any(c.isdigit() for c in token) and token[:1].isupper()
        if (capital or code) and (not run or adjacent):
            run.append(m)
        else:
            close()
            if capital:
                run.append(m)
    close()
    return found


def _sentence_start(text: str, position: int) -> bool:
    before = position - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    return before < 0 or text[before] in ".?!:\n-*•#>"


@lru_cache(maxsize=4096)
def _analyse_text(text: str, heading: str, title: str) -> tuple[str, tuple[Sentence, ...], str, bool, str]:
    """Split a chunk into scorable sentences (cached: a chunk's text does not change)."""
    body = text
    if heading and body.startswith(heading):
        body = body[len(heading):]  # the heading line is a label, not a sentence
    found = []
    for position, sentence in enumerate(sentences(body)):
        sentence = sentence.lstrip("-*• ").strip()
        if len(sentence) < 12 or not is_prose(sentence):
            continue
        found.append(Sentence(
            text=sentence, position=position,
            stems=_stems(sentence, pairs=True),
            has_currency=bool(_CURRENCY_RE.search(sentence)),
            has_number=bool(_NUMBER_RE.search(sentence)),
            names=tuple(dict.fromkeys(folded for _, folded in _name_sequences(sentence))),
            sequence=tuple(_stems(word) for word in _words(sentence)),
            has_money=bool(_MONEY_RE.search(sentence)),
        ))
    parts = [p.strip() for p in heading.split(" > ")] if heading else []
    top = parts[0] if parts else title
    subject = ""
    for display, _folded in _name_sequences(top or ""):
        subject = display
        break
    if not subject and title:
        subject = next((d for d, _ in _name_sequences(title)), "")
    mentions_the = bool(subject) and f"the {subject}".lower() in body.lower()
    kind = kind_of(subject, body) if subject else ""
    return (parts[-1] if len(parts) > 1 else ""), tuple(found), subject, mentions_the, kind


def build_passages(documents: Iterable[RetrievedChunk]) -> list[Passage]:
    """The prompt's documents as ``Passage`` objects, numbered from 1 as they are cited."""
    passages = []
    for index, chunk in enumerate(documents, start=1):
        leaf, found, subject, mentions_the, kind = _analyse_text(chunk.text, chunk.heading or "", chunk.title or "")
        passages.append(Passage(
            index=index, ordinal=chunk.ordinal, heading_leaf=leaf,
            heading_stems=_stems(leaf),
            subject_name=subject, subject=tuple(normalize(subject).split()) if subject else (),
            sentences=found, mentions_the=mentions_the, kind=kind,
        ))
    return passages


# --- The query ----------------------------------------------------------------------------------


@dataclass
class Need:
    """What the question asks: attribute groups with weights, and the subject entities."""

    groups: dict[str, float] = field(default_factory=dict)  # group key -> weight (own 1, inherited 0.5)
    own: set[str] = field(default_factory=set)  # group keys from the user's own words
    labels: dict[str, str] = field(default_factory=dict)  # group key -> words for a decline
    subjects: set[tuple[str, ...]] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)  # names in the question no passage knows
    wants_amount: bool = False  # an amount scores higher
    must_amount: bool = False  # only an amount answers ("How much is it?")
    asked: str = ""  # the words that ask (the question's asking clauses, or one part of them)
    wants_number: bool = False
    # Asked keys written next to each other ("charge wirelessly", "return postage"): a sentence
    # states them together only where they stand close (see PROXIMITY_WINDOW).
    adjacent: list[tuple[str, str]] = field(default_factory=list)
    # Asked comparatives and superlatives ("bigger", "priciest"): which value, beside what it is of.
    comparatives: set[str] = field(default_factory=set)
    # The attribute came from the context or the transformer, not the asking clause: its words
    # describe a situation ("I go running in all weather. Will they cope?"), none is the point.
    promoted: bool = False
    # Entities the user's own words point at that no passage is about, only names in passing.
    mentioned: set[tuple[str, ...]] = field(default_factory=set)


# An object pronoun may stand inside a phrase: "juice them up" is "juice up".
# "Where does it go / do I keep it / do I put it": asks where a thing is placed.
_WHERE_PLACED_RE = re.compile(r"\bwhere\b(?:\s+\S+){1,4}?\s+(?:go|goes|keep|put|store|stow|live|lives|sit|sits|stay|"
                              r"stays|attach|attaches|fit|fits|clip|clips)\b", re.IGNORECASE)
# Words standing for what was asked before ("How much does that cost?").
_TOPIC_POINTERS = frozenset("that this it those these them".split())
# The words before a kind that point at one thing: "my tablet", "the phone" (not "a tablet").
_POINTING_WORDS = frozenset("the this that these those my our".split())
_OBJECT_PRONOUNS = frozenset("it them me him her this that these those one ones mine something anything everything "
                             "stuff".split())


def _phrase_span(tokens: list[str], stems: list[str], i: int, phrase: tuple[str, ...]) -> int:
    """How many tokens from ``i`` spell the stemmed ``phrase`` (``stems`` are the tokens' stems;
    at most one object pronoun may follow its first word), or 0."""
    n = len(phrase)
    if tuple(stems[i:i + n]) == phrase:
        return n
    if n > 1 and i + n < len(tokens) and tokens[i + 1] in _OBJECT_PRONOUNS and (
            stems[i] == phrase[0] and tuple(stems[i + 2:i + n + 1]) == phrase[1:]):
        return n + 1
    return 0


def _group_keys(text: str, table: SynonymTable, skip: set[str],
                positions: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """(group key, display words) for the content of ``text``: phrase groups first, then each
    remaining content word as its synonym groups (a word in no group is its own group). With
    ``positions``, each key's first word position in ``text`` is recorded there."""
    tokens = _words(text)
    stems = [stem(t) for t in tokens]
    if positions is None:
        positions = {}
    used = [False] * len(tokens)
    found: list[tuple[str, str]] = []
    # Longest phrases first, each at every place it occurs (found through its first word); a
    # phrase written as listed before one met only through stems ("on a charging pad" is a
    # charging pad, not "on a charge").
    matches = sorted((tuple(tokens[i:i + n]) != table.phrases[index][0], index, i, n)
                     for i, first in enumerate(stems) for index in table.phrases_from.get(first, ())
                     if (n := _phrase_span(tokens, stems, i, table.stemmed[index])))
    for _inexact, index, i, n in matches:
        phrase, label = table.phrases[index]
        if not any(used[i:i + n]):
            found.append((("~" if phrase in _ANSWER_TYPE_PHRASES else "") + f"={label}", " ".join(phrase)))
            positions.setdefault(found[-1][0], i)
            for j in range(i, i + n):
                used[j] = True
    for i, token in enumerate(tokens):
        if used[i] or token in STOPWORDS or token in GENERIC_WORDS or token in skip:
            continue
        if token == "long" and i and tokens[i - 1] in _POINTING_WORDS | {"a", "an"} and i + 1 < len(tokens):
            continue  # "on a long flight", "a long weekend": it describes the thing, asks no length
        if len(token) < 2 and not token.isdigit():
            continue
        s = stem(token)
        if s in _GENERIC_STEMS:  # "paired" is as generic as "pair", "needs" as "need"
            continue
        labels = table.of_stem.get(s)
        if labels:  # the word itself, and its groups: "wireless charging" prefers "wireless"
            found.append((s + "=" + "|".join(labels), NOUN_OF.get(token, token)))
        else:
            found.append((s, token))
        positions.setdefault(found[-1][0], i)
    return found


def analyse_query(question: str, search_query: str, passages: list[Passage], table: SynonymTable,
                  asked: str | None = None) -> Need:
    """Split the user's ``question`` and the transformed ``search_query`` into subject and attribute
    (the attribute of ``asked``, one part of the question, when given)."""
    need = Need()
    vocabulary = frozenset().union(*(s.stems for p in passages for s in p.sentences),
                                   *(p.heading_stems for p in passages))
    # "nimbus tab weigth", "retrun policy?", "Zepyhr Buds": one slip of the keys from a word the
    # passages or the table know is that word.
    question, search_query = _corrected(question, vocabulary, table), _corrected(search_query, vocabulary, table)
    if asked is not None:
        asked = _corrected(asked, vocabulary, table)
    # The entities the passages know about: their subjects and the names in their sentences.
    known: set[tuple[str, ...]] = set()
    for p in passages:
        if p.subject:
            known.add(p.subject)
        for s in p.sentences:
            known.update(tuple(n.split()) for n in s.names)
    def named(query_words: set[str], type_words: bool = True) -> set[tuple[str, ...]]:
        query_words = query_words | {stem(w) for w in query_words}  # "my Zephyrs"
        full = {e for e in known if set(e) <= query_words}
        # "Zephyr" alone names the Zephyr Buds; a full name ("Nimbus Pen") beats a shared word.
        # Without ``type_words`` the shared word must be the name's first word or a model code:
        # "the pen" is not the Nimbus Pen when the conversation is about the Nimbus Tab.
        partial = {e for e in known if any(
            type_words or w == e[0] or any(c.isdigit() for c in w)
            for w in set(e) & query_words - STOPWORDS - GENERIC_WORDS)} if not full else set()
        # "Zappa" also means the "Frank Zappa" a heading names: add the longer names containing it.
        return (full or partial) | {e for e in known if any(set(f) < set(e) for f in full)}

    own_words = set(_words(question))
    everything = named(own_words | set(_words(search_query)))
    # The user's own words name the subject when they name one: in "And the Aurora X2?" after
    # the Nimbus Tab, the transformer's inherited "Nimbus Tab" is context, not the subject.
    inherited = {e for e in known if set(e) <= set(_words(search_query))}
    # Of the names the question holds, those of its asking clauses: "How long is the Aurora X2's
    # warranty? My Zephyr Buds came with two years." asks about the Aurora X2 alone.
    asking_words = set(_words(" ".join(_asked_clauses(question)) if asked is None else asked))
    in_asking = {e for e in known if set(e) <= asking_words | {stem(w) for w in asking_words}}
    need.subjects = in_asking or named(own_words, type_words=not inherited) or everything
    # "And the pen?" in a conversation about the Nimbus Tab: the Nimbus Pen its sentences name.
    headed = {p.subject for p in passages if p.subject}
    need.mentioned = {e for e in everything if e not in headed and set(e) & (own_words - STOPWORDS - GENERIC_WORDS)}
    if not need.subjects:
        need.subjects = _subject_by_kind(question, passages)
    for display, folded in _name_sequences(question):
        tokens = set(folded.split())
        if not any((tokens | {stem(t) for t in tokens}) & set(e) for e in known) and not tokens <= STOPWORDS | GENERIC_WORDS:
            need.unknown.append(display)
    names = {w for e in everything | need.subjects for w in e}  # names are subjects, not attributes
    # In "I have an Aurora X2. How long does the battery last?" (or a pasted "Ignore all previous
    # instructions. How much...?") the attribute is what the question sentence asks.
    part = asked is not None  # one part of the question: the search query holds the other parts' words
    if asked is None:
        asked = " ".join(_asked_clauses(question))
    need.asked = asked
    asked_at: dict[str, int] = {}
    for text, weight in ((asked, 1.0), (search_query, 0.5)):
        positions: dict[str, int] = {}
        for key, label in _group_keys(text, table, names, positions):
            at = positions[key]
            comparative = _word_of(key) in _COMPARATIVES
            if "=" not in key and key not in vocabulary:
                key = _derived(key, vocabulary, table)
            if comparative and weight == 1.0:
                need.comparatives.add(_word_of(key))
            if weight == 1.0:
                asked_at.setdefault(key, at)
            if key not in need.groups:
                need.groups[key] = weight
                need.labels[key] = label
            if weight == 1.0:
                need.own.add(key)
    lasting = [k for k in need.own if k.split("=")[0] == "last"]
    if lasting and re.search(r"\bhow\s+long\b", asked, re.IGNORECASE) and any(
            not k.startswith("~") and k not in lasting for k in need.own):
        # "How long does the warranty last?": "last" says it asks a duration, not a battery life.
        _forget(need, lasting, asked_at)
    lengths = [k for k in need.own if k.split("=")[0] == "length"]
    if lengths and any(set(_labels(k)) & _TIME_BEARING_GROUPS for k in need.own):
        # "zephyr buds warranty length" asks how long the warranty runs, not a length in cm.
        _forget(need, lengths, asked_at)
    coming = [k for k in need.own if k == "=included" and need.labels.get(k, "").startswith(("come", "came"))]
    if coming and _QUANTITY_QUESTION_RE.search(asked) and len(need.own) > 1:
        # "How much storage does it come with?" asks the storage: "come with" says it has it.
        _forget(need, coming, asked_at)
    by_place = sorted((at, key) for key, at in asked_at.items() if not key.startswith("~"))
    need.adjacent = [(a, b) for (i, a), (j, b) in zip(by_place, by_place[1:]) if j - i <= 2]
    if not part:
        _take_carried_attribute(need, question, asked, set(asked_at), table, names)
    # "How much is the biggest one?" asks a price: a comparative says which, not what is measured.
    own_groups = {label for k in need.own if _word_of(k) not in need.comparatives for label in _labels(k)}
    all_groups = {label for k in need.groups for label in _labels(k)}
    if ("shipping" in own_groups and "return" in all_groups and "return shipping" not in own_groups
            and ("price" in own_groups or "postag" in _stems(asked))):
        # "If I send it back, am I on the hook for the postage?" asks who pays return shipping.
        need.groups["=return shipping"] = 1.0
        need.labels["=return shipping"] = "return shipping"
        need.own.add("=return shipping")
    need.wants_amount = bool("price" in own_groups or (
        _PRICE_QUESTION_RE.search(asked) and not own_groups & _MEASURE_GROUPS))
    need.must_amount = bool(_PRICE_QUESTION_RE.search(asked) and not own_groups & _MEASURE_GROUPS)
    if "pay" in _words(asked) and not _PRICE_QUESTION_RE.search(asked):
        need.wants_amount = False  # "Do I have to pay for..." is answered by "free" as well as by "$15"
    need.wants_number = bool(_QUANTITY_QUESTION_RE.search(asked))
    if _WHERE_PLACED_RE.search(asked) and not any("attachment" in _labels(k) for k in need.own):
        # "Where does the pen go when I'm not drawing?": where a thing is kept is how it attaches.
        need.groups["=attachment"] = 1.0
        need.labels["=attachment"] = "where it goes"
        need.own.add("=attachment")
    if need.wants_amount and not any("price" in _labels(k) for k in need.own):
        need.groups["=price"] = 1.0  # "How much are Zephyr Buds?" asks the price
        need.labels["=price"] = "price"
        need.own.add("=price")
    return need


def _forget(need: Need, keys: list[str], asked_at: dict[str, int]) -> None:
    """Take ``keys`` out of what ``need`` asks: a word that only says how something is asked."""
    for key in keys:
        need.own.discard(key)
        need.groups.pop(key, None)
        asked_at.pop(key, None)


def _subject_by_kind(question: str, passages: list[Passage]) -> set[tuple[str, ...]]:
    """"My tablet stopped working", "Is the phone waterproof?": the one subject the passages
    define as one of that kind (``Passage.kind``), when the question points at it ("the", "my",
    not "a tablet") and no other subject is of that kind; else none."""
    kinds: dict[str, set[tuple[str, ...]]] = {}
    for p in passages:
        if p.kind:
            kinds.setdefault(stem(p.kind), set()).add(p.subject)
    tokens = _words(question)
    pointed = {stem(w) for before, w in zip(tokens, tokens[1:]) if before in _POINTING_WORDS}
    asked_kinds = pointed & {k for k, subjects in kinds.items() if len(subjects) == 1}
    return {next(iter(kinds[k])) for k in asked_kinds} if len(asked_kinds) == 1 else set()


# "What is the Nimbus Tab designed for?" asks what the thing is, which its description says; the
# context's words ("A customer asked before ordering") are not the attribute.
_PURPOSE_RE = re.compile(r"\b(?:designed|meant|intended|made|built|suited|good|used|for)\s+for\b|\bwhat\b.*\bfor\s*\??\s*$",
                         re.IGNORECASE)


def _take_carried_attribute(need: Need, question: str, asked: str, typed_keys: set[str], table: SynonymTable,
                            names: set[str]) -> None:
    """Make the words the search query carried (the transformer's, or the question's context)
    the asked attribute where the asking clause alone does not say what it is about."""
    def promote(keys: set[str]) -> None:
        need.own |= keys
        need.groups.update(dict.fromkeys(keys, 1.0))

    carried = {key for key in need.groups if key not in typed_keys and not key.startswith("~")}
    if (need.own and not need.subjects and set(_words(asked)) & _TOPIC_POINTERS
            and all(key.startswith("~") or _labels(key) == ["price"] for key in need.own)):
        # "How much does that cost?" after "How fast do you ship?": it asks a price, and with no
        # product in play the words the transformer carried ("fast ship") are what "that" is.
        promote(carried - need.own)
    if need.own and all(key.startswith("~") for key in need.own):
        # "How long is it?" asks only the kind of value: what it is about came with the search
        # query ("... Zephyr Buds warranty").
        promote({key for key in carried if need.groups[key] == 0.5})
    if not need.own and need.groups and not _PURPOSE_RE.search(asked):
        # "What about the Nimbus Tab?": the attribute is the one the transformer carried over, or
        # the context's ("I lost one of my Zephyr Buds, what now?"); but "hi, quick question -
        # how much is it?" asks a price, not the context's words.
        typed = {key for key, _ in _group_keys(question, table, names)} if _PRICE_QUESTION_RE.search(asked) else set()
        promoted = {key for key in need.groups if key not in typed}
        if promoted:
            need.promoted = True
            promote(promoted)


# Comparatives and superlatives: in "the bigger storage options" they say which value of the
# attribute beside them, not another attribute.
_COMPARATIVES = frozenset(stem(w) for w in """bigger biggest larger largest smaller smallest longer longest shorter
    shortest faster fastest quicker quickest slower slowest cheaper cheapest pricier priciest lighter lightest
    heavier heaviest higher highest lower lowest newer newest better best greater greatest brighter brightest
    thinner thinnest thicker thickest wider widest more most less least extra""".split())


#: A word this long or longer that neither the passages nor the table know is read as the one
#: known word (of this length or longer) a single typo away: a letter missing, extra, wrong or
#: two letters swapped ("weigth", "retrun", "Auroa").
TYPO_MIN_LENGTH = 5


# A number written against its unit ("128gb", "5000mah", "30mins"), as documents rarely write it.
_JOINED_UNIT_RE = re.compile(r"\b(\d+(?:[.,]\d+)?)(gb|tb|mb|mah|mm|cm|kg|hz|mp|w|hrs?|mins?|nits|gigs?|days?|"
                             r"years?|months?|weeks?|hours?)\b", re.IGNORECASE)


def _corrected(text: str, vocabulary: frozenset[str], table: SynonymTable) -> str:
    """``text`` with each unknown word of ``TYPO_MIN_LENGTH`` letters or more replaced by the one
    known stem a single typo away, when there is exactly one (same first letter), and a number
    written against its unit set apart from it ("128gb" is "128 gb")."""
    text = _JOINED_UNIT_RE.sub(r"\1 \2", text)

    def known(word: str) -> bool:
        stemmed = stem(word)
        return (stemmed in vocabulary or stemmed in table.of_stem or stemmed in table.phrases_from
                or stemmed in _GENERIC_STEMS or word in table.phrases_from)

    def fix(match: re.Match) -> str:
        word = _fold(match.group(0))
        if "-" in word and not known(word) and any(known(part) for part in word.split("-") if len(part) > 2):
            return match.group(0).replace("-", " ")  # "top-capacity" is "top capacity"; "front-facing" stays
        if len(word) < TYPO_MIN_LENGTH or not word.isalpha() or word in STOPWORDS or word in GENERIC_WORDS:
            return match.group(0)
        if known(word):
            return match.group(0)
        stemmed = stem(word)
        found = {c for c in (*vocabulary, *table.of_stem) if len(c) >= TYPO_MIN_LENGTH and c[0] == word[0]
                 and (_one_typo(word, c) or _one_typo(stemmed, c))}
        if len(found) > 1 and len({table.of_stem.get(c) for c in found}) == 1 and table.of_stem.get(next(iter(found))):
            found = {min(found)}  # "weigth": "weight" or "weigh", the same group either way
        return next(iter(found)) if len(found) == 1 else match.group(0)

    return _WORD_RE.sub(fix, text)


def _one_typo(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one insertion, deletion, substitution or swap of two
    neighbouring letters (Damerau-Levenshtein distance 1)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i in range(len(short)) if short[i] != long_[i]), len(short))
    return short[i:] == long_[i + 1:]


def _derived(word: str, vocabulary: frozenset[str], table: SynonymTable) -> str:
    """The need key of a question word (a stem) that neither the passages nor the table know,
    read through a derivational suffix when that meets them: "sweaty" is "sweat", "sunny" is
    "sun", "readable" is "read", "lighter" is "light", "old" is the passages' "older";
    otherwise the word itself."""
    for longer in (word + "er", word + "est"):  # "old" meets "older"
        if longer in vocabulary:
            return longer
    if word.isalpha() and len(word) >= 2:  # "What IPX rating?" meets the code "IPX4"
        codes = [v for v in vocabulary if v.startswith(word) and v[len(word):len(word) + 1].isdigit()
                 and "-" not in v]
        if len(codes) == 1:
            return codes[0]
    for suffix in ("ier", "iest"):  # "heavier" is "heavy"
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[:-len(suffix)] + "y"
            if base in table.of_stem:
                return base + "=" + "|".join(table.of_stem[base])
            if base in vocabulary:
                return base
    for suffix in ("y", "ness", "ful", "able", "ible", "er", "est"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[:-len(suffix)]
            for candidate in (base, base[:-1] if base[-1] == base[-2] else base):
                if candidate in table.of_stem:
                    return candidate + "=" + "|".join(table.of_stem[candidate])
                if candidate in vocabulary:
                    return candidate
    return word


#: A question word that no passage and no synonym group knows ("internationally", or a
#: paraphrase the table misses) weighs this much of a known word as rare.
UNKNOWN_WORD_WEIGHT = 0.3
#: ... except in a question that asks at most this many words: there every word is the point
#: ("Do you ship internationally?", "Can I pay monthly?").
SHORT_QUESTION_WORDS = 2

# A question comparing subjects ("Which one is the lightest?"); answered per subject when it
# names none, each subject's sentence stating at least COMPARED_COVERAGE of what was asked.
_COMPARISON_RE = re.compile(
    r"\b(?:which|cheapest|priciest|most|least|lightest|heaviest|biggest|smallest|largest|longest|shortest|"
    r"fastest|best|compare|versus|vs|cheaper|pricier|lighter|heavier|bigger|smaller|larger|longer|shorter|"
    r"faster|better|more|less)\b", re.IGNORECASE)
COMPARED_COVERAGE = 0.75

#: The sentence before the best one joins the answer when its share of the asked attribute is
#: at most this much lower.
PRECEDING_MARGIN = 0.25

#: Two asked words written side by side count as stated together only when the sentence has
#: them at most this many words apart; otherwise PROXIMITY_PENALTY of the rarer one's weight
#: is taken off ("Can the case charge wirelessly?" against "wireless earbuds with ... eight
#: hours on one charge").
PROXIMITY_WINDOW = 4
PROXIMITY_PENALTY = 0.5


def _apart(a: str, b: str, sentence: Sentence, table: SynonymTable) -> bool:
    """Whether ``sentence`` states keys ``a`` and ``b`` but never within PROXIMITY_WINDOW words."""
    at_a, at_b = _places(a, sentence, table), _places(b, sentence, table)
    if not at_a or not at_b:
        return False
    return min((abs(i - j) for i in at_a for j in at_b if i != j), default=0) > PROXIMITY_WINDOW


#: What an asked word is worth where a sentence only names a fault of it ("battery failure",
#: "screen repair") and the question asked about neither warranty nor repairs.
FAULT_QUALIFIER_EVIDENCE = 0.5
_FAULT_GROUPS = frozenset({"warranty", "repair"})


def _qualifies_a_fault(key: str, sentence: Sentence, asked: set[str], table: SynonymTable) -> bool:
    """Whether every place ``sentence`` states ``key`` is right before a word of the warranty or
    repair groups, when the question asked about neither ("covers battery failure")."""
    if asked & _FAULT_GROUPS:
        return False
    places = _places(key, sentence, table)
    for i in places:
        following = sentence.sequence[i + 1] if i + 1 < len(sentence.sequence) else frozenset()
        if not any(set(table.of_stem.get(st, ())) & _FAULT_GROUPS for st in following):
            return False
    return bool(places)


def _places(key: str, sentence: Sentence, table: SynonymTable) -> list[int]:
    """Where ``sentence`` states ``key``: the asked word's places, else its group's."""
    word = _word_of(key)
    own = [i for i, stems in enumerate(sentence.sequence) if word and word in stems]
    return own or [i for i, stems in enumerate(sentence.sequence) if _covers(key, stems, table)]


#: A sentence opening with the asked subject's name is about it: its score rises this much
#: (more than one retrieval rank), so "Zephyr Buds cost $149." answers their price before
#: "...a single replacement bud costs $39." of a passage ranked above.
SUBJECT_OPENING_BONUS = 0.15

#: How much a synonym counts against the asked word itself ("charges" for "wireless").
SYNONYM_EVIDENCE = 0.8


def _labels(key: str) -> list[str]:
    """The synonym groups of a need key: "stem=label|label" for a word, "=label" for a phrase
    ("~=label" for an answer-type phrase such as "how long")."""
    _, _, labels = key.partition("=")
    return labels.split("|") if labels else []


_PART_SPLIT_RE = re.compile(r",?\s+and\s+(?=(?:what|what's|which|how|where|when|who|is|are|does|do|did|can|could|will|"
                            r"would|should|has|have)\b)", re.IGNORECASE)


def question_parts(question: str) -> list[str]:
    """The separate questions in ``question``: its question sentences, each split before
    "and how/what/does..." ("How many watts, and how long till it's half full?"). Alternatives
    ("..., or is it free?") ask one thing and stay whole."""
    asked = _asked_clauses(question)
    parts = [part.strip() for q in asked for part in _PART_SPLIT_RE.split(q)]
    return [part for part in parts if _words(part)]


# A question asked inside a statement: "(I'd like to) know how long...", "wondering whether...".
_EMBEDDED_QUESTION_RE = re.compile(r"\b(?:know|knowing|wondering|wonder|wondered|tell me|tell us|confirm|ask|asks|"
                                   r"asked|asking|check|find out|clarify|advise|understand|enquire|inquire|curious)\s+"
                                   r"((?:if|whether|how|what|which|when|where|who|why)\b)", re.IGNORECASE)
# Where a question's context clause ends: "I sketch by a window - will the screen glare?".
_CLAUSE_SEPARATOR_RE = re.compile(r",\s+|\s+[-–—]+\s+|;\s+")


def _asked_clauses(question: str) -> list[str]:
    """The asking clause of each question sentence; without a "?", of the last sentence
    ("hi, quick question - how much is the aurora x2")."""
    found = sentences(question)
    asked = [_asked_clause(q) for q in found if q.endswith("?")]
    return asked or [_asked_clause(found[-1] if found else question)]


def _asked_clause(question: str) -> str:
    """The part of a question sentence that asks: "I read in bed for hours, is it heavy?" asks
    "is it heavy?"; "If I top them up from the case, how much listening...?" asks from "how".
    The clauses before it are context (they still count, at half weight, via the search query)."""
    head = next(iter(_words(question)), "")
    if head in _WH_WORDS or head in _POLAR_WORDS:
        return question
    for separator in _CLAUSE_SEPARATOR_RE.finditer(question):
        rest = question[separator.end():]
        opener = next(iter(_words(rest)), "")
        if opener in ("or", "and", "but", "so"):
            opener = next(iter(_words(rest)[1:]), "")
        if opener in _WH_WORDS or opener in _POLAR_WORDS:
            return rest
    # "I'd like to know how long the warranty on the Aurora X2 lasts; my Zephyr Buds came with
    # two years": a question put as a statement asks from its embedded question word to the end
    # of that clause; the rest is context.
    embedded = _EMBEDDED_QUESTION_RE.search(question)
    if embedded:
        rest = question[embedded.start(1):]
        end = _CLAUSE_SEPARATOR_RE.search(rest)
        return rest[:end.start()] if end and _words(rest[:end.start()])[1:] else rest
    return question


def _word_of(key: str) -> str:
    """The asked word's stem of a need key ("" for a phrase's key)."""
    return key.partition("=")[0].lstrip("~")


def _covers(key: str, stems: frozenset[str], table: SynonymTable) -> float:
    """How strongly ``stems`` state ``key``: 1 for the asked word (or an asked phrase's group),
    ``SYNONYM_EVIDENCE`` for another word of its group, 0 for none."""
    word, labels = _word_of(key), key.partition("=")[2]
    if word and word in stems:
        return 1.0
    if labels and any(table.groups[label] & stems for label in labels.split("|")):
        return SYNONYM_EVIDENCE if word else 1.0
    return 0.0


# --- The answerer -------------------------------------------------------------------------------


# "How long does it take to recharge?", "how long till it's half full", "how fast does it charge":
# the time charging takes, which a sentence states only with a charging verb and a time.
_CHARGING_TIME_QUESTION_RE = re.compile(
    r"\bhow\s+(?:long|many\s+(?:minutes|hours|mins))\b.*\b(?:take|takes|taking|till|til|until|to\s+get|to\s+reach|to\s+go)\b"
    r"|\bhow\s+(?:quickly|fast|soon)\b", re.IGNORECASE)
# A charging verb, not the battery-life noun of "on one charge", "per charge", "three more charges".
_CHARGING_VERB_RE = re.compile(r"(?<!\bone )(?<!\ba )(?<!\bper )(?<!\bsingle )(?<!\bmore )(?<!\bfull )(?<!\beach )"
                               r"\b(?:re)?charg(?:es|ed|ing|e)\b|\breach(?:es|ing)?\b", re.IGNORECASE)
_TIME_SPAN_RE = re.compile(r"\b(?:\d+|an?|one|two|three|four|five|six|seven|eight|nine|ten|half\s+an?)\s*"
                           r"(?:minutes?|mins?|hours?|hrs?)\b", re.IGNORECASE)
# A storage capacity written in a question or a sentence: "128 GB", "1TB".
_CAPACITY_RE = re.compile(r"\b(\d+)\s?(gb|tb)\b", re.IGNORECASE)


def asks_charging_time(asked: str) -> bool:
    """Whether the asking words ask how long something takes ("how long ... take", "how fast");
    the answerer applies it only when a charging word is asked too."""
    return bool(_CHARGING_TIME_QUESTION_RE.search(asked))


def states_charging_time(sentence: str) -> bool:
    """Whether ``sentence`` states a charging time ("reaching 50% in 20 minutes")."""
    return bool(_CHARGING_VERB_RE.search(sentence) and _TIME_SPAN_RE.search(sentence))


def _capacities(text: str) -> set[tuple[str, str]]:
    return {(number, unit.lower()) for number, unit in _CAPACITY_RE.findall(text)}


@dataclass(frozen=True)
class Choice:
    """A candidate sentence with its score and the share of the asked attribute it states."""

    passage: Passage
    sentence: Sentence
    score: float
    coverage: float


class AnswerSelector:
    """The engine, independent of Django and the pipeline: ``answer(prompt) -> str``."""

    def __init__(self, *, synonyms: dict[str, Iterable[str]] | None = None,
                 min_coverage: float = DEFAULT_MIN_COVERAGE,
                 max_sentences: int = 4, rank_prior: float = 0.1,
                 no_answer: str = "I can't answer that from the documents I have."):
        if isinstance(min_coverage, bool) or not isinstance(min_coverage, (int, float)) or not 0 <= min_coverage <= 1:
            raise ValueError(f"min_coverage must be a number from 0 to 1, not {min_coverage!r}")
        if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
            raise ValueError(f"max_sentences must be a whole number of at least 1, not {max_sentences!r}")
        self.table = SynonymTable.build(synonyms) if synonyms is not None else default_table()
        self.min_coverage = min_coverage
        self.max_sentences = max_sentences
        self.rank_prior = rank_prior
        self.no_answer = no_answer

    # The subject guard ------------------------------------------------------------------------
    def on_subject(self, passage: Passage, sentence: Sentence, subjects: set[tuple[str, ...]],
                   known: set[tuple[str, ...]], heads: frozenset[tuple[str, ...]] = frozenset()) -> bool:
        """A sentence naming a subject is on it; otherwise it must come from a passage about a
        subject (its heading's, or one its sentences name: "It senses 4,096 levels" under
        Nimbus Tab > Stylus is about the Nimbus Pen named before it) and not be about an entity
        foreign to that passage: one that heads another passage ("Zephyr Buds" of "Zephyr Buds
        > Warranty"), or that the sentence opens with. Other names in passing (people, places in
        an encyclopedia article) do not make a sentence off-subject."""
        names = {tuple(n.split()) for n in sentence.names} & known
        if names & subjects:
            return True
        if passage.subject not in subjects and not any(
                {tuple(n.split()) for n in other.names} & subjects for other in passage.sentences):
            return False
        own = set(passage.subject)
        opening = _fold(sentence.text)
        for name in names:
            if set(name) & own:
                continue
            folded = " ".join(name)
            if name in heads or opening.startswith((folded, "the " + folded)):
                return False
        return True

    def answer(self, prompt: Prompt) -> str:
        passages = build_passages(prompt.documents)
        if not any(p.sentences for p in passages):
            return self.no_answer
        # Markup in a message is no part of what it asks ("<script>...</script> How much is it?").
        question = _without_markup(prompt.question)
        search_query = _without_markup(prompt.search_query or prompt.question)
        need = analyse_query(question, search_query, passages, self.table)
        if need.unknown and not need.subjects:
            # "Does the Galaxy S9 have a warranty?": another product's warranty is no answer.
            names = " or ".join(dict.fromkeys(need.unknown))
            return f"The documents don't mention {names}, so I can't answer that from them."
        if _COMPARISON_RE.search(question) and (not need.subjects or len(need.subjects) > 1):
            compared = self.compare(need, passages)
            if compared:
                return compared
        eligible = self.eligible(need, passages)
        parts = question_parts(question)
        if len(parts) < 2:
            picked = self.pick(need, passages, eligible)
            return self.cited(picked) if picked else self.decline(need, passages, eligible)
        # "How many watts does it take, and how long till it's half full?": each part is answered
        # on its own (one part's words would dilute the other's), the subject (and so the
        # eligible sentences) from the whole.
        answered: list[Choice] = []
        unanswered: list[Need] = []
        for part in parts:
            part_need = analyse_query(question, search_query, passages, self.table, asked=part)
            picked = self.pick(part_need, passages, eligible) if part_need.own else []
            if picked:
                answered += [c for c in picked if all(c.sentence is not a.sentence for a in answered)]
            elif part_need.own:
                unanswered.append(part_need)
        if not answered:
            return self.decline(need, passages, eligible)
        text = self.cited(answered[:self.max_sentences + 1])
        stated = frozenset().union(*(c.sentence.stems | c.passage.heading_stems for c in answered))
        unanswered = [n for n in unanswered if not any(_covers(k, stated, self.table) for k in n.own)]
        for part_need in unanswered:  # say what is missing, without the list of what was found
            text += " " + self.decline(part_need, passages, eligible).split(". ")[0]
            text = text if text.endswith(".") else text + "."
        return text

    def compare(self, need: Need, passages: list[Passage]) -> str:
        """"Which product is the cheapest?": each subject's own answer (of the subjects the question
        names, when it names several), for the reader to compare (the answerer quotes, it does
        not rank), or "" when fewer than two subjects state it."""
        found = []
        for subject in dict.fromkeys(p.subject for p in passages if p.subject):
            if need.subjects and subject not in need.subjects:
                continue  # "Which lasts longer, the Nimbus Tab or the Zephyr Buds?": those two
            one = replace(need, subjects={subject})
            picked = self.select(one, passages, self.eligible(one, passages))
            if picked and picked[0].coverage >= COMPARED_COVERAGE:
                found.append(picked[0])
        return self.cited(found[:self.max_sentences]) if len(found) > 1 else ""

    def pick(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """The answer to ``need`` from the on-subject sentences, else from the shop's policy ones."""
        return self.select(need, passages, eligible) or self.select(need, passages, self.policy(need, passages))

    def policy(self, need: Need, passages: list[Passage]) -> list[tuple[Passage, Sentence]]:
        """The shop's own policy sentences, for a question about a product that its passages do
        not answer ("How long do I have to return them?" after the Zephyr Buds): sentences of a
        passage about another subject, when the question asks a ``POLICY_GROUPS`` attribute, the
        passage's heading names it ("Returns") and no sentence of it names another catalogue
        subject. Empty otherwise (a product's warranty is never another product's)."""
        asked = {label for k in need.own for label in _labels(k)} & POLICY_GROUPS
        if not need.subjects or not asked:
            return []
        heads = {p.subject for p in passages if p.subject}
        found = []
        for p in passages:
            if p.subject in need.subjects or not {label for st in p.heading_stems
                                                  for label in self.table.of_stem.get(st, ())} & asked:
                continue
            names = {tuple(n.split()) for s in p.sentences for n in s.names}
            if any(name in heads and name != p.subject and not set(name) <= set(p.subject) for name in names):
                continue
            found += [(p, s) for s in p.sentences]
        return found

    def eligible(self, need: Need, passages: list[Passage]) -> list[tuple[Passage, Sentence]]:
        """The (passage, sentence) pairs on the question's subject."""
        known = {p.subject for p in passages if p.subject} | {
            tuple(n.split()) for p in passages for s in p.sentences for n in s.names}
        heads = frozenset(p.subject for p in passages if p.subject)
        return [(p, s) for p in passages for s in p.sentences
                if not need.subjects or self.on_subject(p, s, need.subjects, known, heads)]

    @staticmethod
    def cited(picked: list[Choice]) -> str:
        return " ".join(cite(c.sentence.text, c.passage.index) for c in picked)

    def select(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """The sentences of ``eligible`` (``self.eligible(need, passages)``) that answer ``need``,
        in order; empty when none states enough of it."""
        if not eligible:
            return []

        if not need.own:
            # "Tell me about the Aurora X2": no attribute asked, so the subject's description,
            # which a document gives first: the on-subject passage earliest in its document
            # (the retrieval rank breaks ties), not whichever section was ranked first.
            naming = [(p, s) for p, s in eligible if {tuple(n.split()) for n in s.names} & need.mentioned]
            if naming:  # "And the pen?": what the passages say of the Nimbus Pen, from where they name it
                # A sentence opening with the name is about it ("The Nimbus Pen attaches..."), one
                # naming it in passing is about something else ("the bundle with the Nimbus Pen").
                p, first = min(naming, key=lambda ps: (not any(
                    _fold(ps[1].text).startswith((" ".join(e), "the " + " ".join(e))) for e in need.mentioned),
                    ps[0].index, ps[1].position))
                return [Choice(p, s, 0.0, 0.0) for q, s in eligible if q is p and s.position >= first.position][:2]
            opening = min({id(p): p for p, _ in eligible}.values(), key=lambda p: (p.ordinal, p.index))
            return [Choice(p, s, 0.0, 0.0) for p, s in eligible if p is opening][:2]

        # IDF of each asked group over the candidate sentences: rare evidence weighs more.
        all_sentences = [(p, s) for p in passages for s in p.sentences]
        n = len(all_sentences)
        idf = {}
        for key in need.groups:
            df = sum(_covers(key, s.stems, self.table) for _, s in all_sentences)
            idf[key] = math.log(1 + (n + 1) / (1 + df))
            # A word the subject's passages never use, and no synonym group knows, is as likely
            # a paraphrase ("patches against hackers") as the point; it weighs less.
            if "=" not in key and (len(need.own) > SHORT_QUESTION_WORDS or need.promoted) and not any(
                    key in s.stems or key in p.heading_stems for p, s in eligible):
                idf[key] *= UNKNOWN_WORD_WEIGHT
            if (key.startswith("~") or _word_of(key) in need.comparatives) and len(need.own) > 1:
                idf[key] *= ANSWER_TYPE_WEIGHT  # "how long", or "bigger" in "bigger storage options"
        own_total = sum(idf[k] for k in need.own) or 1.0
        all_total = sum(idf[k] * w for k, w in need.groups.items()) or 1.0

        asked_labels = {label for k in need.own for label in _labels(k)}
        openings = tuple(f"{article}{' '.join(subject)}" for subject in need.subjects for article in ("", "the "))
        choices = []
        decisive = [k for k in need.own if set(_labels(k)) & DECISIVE_GROUPS]
        charging_time = asks_charging_time(need.asked) and "charging" in asked_labels
        capacities = _capacities(need.asked)
        for p, s in eligible:
            if any(not _covers(k, s.stems, self.table) and not _covers(k, p.heading_stems, self.table)
                   for k in decisive):
                continue  # "Is there a student discount?" is not answered by "$200 off" for a trade-in
            if charging_time and not states_charging_time(s.text):
                continue  # "How long does it take to recharge?" is not "eight hours ... on one charge"
            if capacities and not capacities <= _capacities(s.text):
                continue  # "Is there a 128 GB Nimbus Tab?" is not answered by "$449 with 64 GB"
            own_cov = all_cov = 0.0
            for key, weight in need.groups.items():
                evidence = _covers(key, s.stems, self.table)
                if s.has_money and "price" in _labels(key):
                    evidence = max(evidence, SYNONYM_EVIDENCE)  # "$200" states a price
                if evidence and key in need.own and _qualifies_a_fault(key, s, asked_labels, self.table):
                    evidence *= FAULT_QUALIFIER_EVIDENCE  # "covers battery failure" is no battery life
                evidence = evidence or 0.6 * _covers(key, p.heading_stems, self.table)
                if not evidence:
                    continue
                all_cov += evidence * weight * idf[key]
                if key in need.own:
                    own_cov += evidence * idf[key]
            for a, b in need.adjacent:  # "wireless earbuds ... one charge" is no wireless charging
                if _apart(a, b, s, self.table):
                    own_cov -= PROXIMITY_PENALTY * min(idf[a], idf[b])
            own_cov /= own_total
            score = own_cov + 0.3 * all_cov / all_total - self.rank_prior * (p.index - 1)
            if need.wants_amount and s.has_currency:
                score += 0.25
            elif need.wants_number and s.has_number:
                score += 0.15
            score -= 0.002 * max(0, len(s.stems) - 30)
            if _has_other_topic(s, need, self.table):  # "10% off the price" is not the price
                score -= 0.3
            if openings and _fold(s.text).startswith(openings):
                score += SUBJECT_OPENING_BONUS  # "Zephyr Buds cost $149", not "a replacement bud costs"
            choices.append(Choice(p, s, score, own_cov))
        if need.must_amount:  # "how much" is answered by an amount, not by a description
            choices = [c for c in choices if c.sentence.has_currency]
        if need.wants_number:  # "how long / how many / how heavy" is answered by a quantity
            choices = [c for c in choices if c.sentence.has_number or c.sentence.has_currency]
        if not choices:
            return []
        best = max(choices, key=lambda c: (c.score, -c.passage.index, -c.sentence.position))
        if best.coverage < self.min_coverage:
            return []
        return self.compose(best, choices, need)

    def compose(self, best: Choice, choices: list[Choice], need: Need) -> list[Choice]:
        """The best sentence, then the sentences that continue its attribute in its passage; the
        sentence just before it too when that one states as much of what was asked ("Orders ship
        within two business days." before "...express delivery arrives the next business day")."""
        stated = {k for k in need.own if _covers(k, best.sentence.stems, self.table)}
        if not stated:  # stated only by the heading ("Pricing" over "$449"): continue on numbers
            stated = {k for k in need.own if _covers(k, best.passage.heading_stems, self.table)}
        picked = [best]
        in_passage = sorted((c for c in choices if c.passage is best.passage), key=lambda c: c.sentence.position)
        before = [c for c in in_passage if c.sentence.position == best.sentence.position - 1]
        if before and before[0].coverage >= max(self.min_coverage, best.coverage - PRECEDING_MARGIN) and (
                not need.must_amount or before[0].sentence.has_currency):
            picked.insert(0, before[0])
        following = [c for c in in_passage if c.sentence.position > best.sentence.position]
        expected = best.sentence.position + 1
        for c in following:
            if len(picked) >= self.max_sentences or c.sentence.position != expected:
                break
            own_words = any(_covers(k, c.sentence.stems, self.table) for k in stated)
            same_kind = (need.wants_amount and c.sentence.has_currency and best.sentence.has_currency
                         and not _has_other_topic(c.sentence, need, self.table))
            if not (own_words or same_kind):
                break
            picked.append(c)
            expected += 1
        return picked

    def decline(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> str:
        """Say plainly that the documents don't state it, naming what they do describe."""
        # Name what is lacking: "Do you ship to Canada?" lacks Canada, not shipping; "how long"
        # beside another word only says what kind of value was asked.
        asked = [k for k in need.groups if k in need.own and not (k.startswith("~") and len(need.own) > 1)]
        lacking = [k for k in asked if not any(
            _covers(k, s.stems, self.table) or _covers(k, p.heading_stems, self.table) for p, s in eligible)]
        # Lacking words that a question word parts ("...for staff what is the warranty on them") are
        # not one topic: the attributes the table knows say what was asked ("warranty").
        span = _words(_span_of(need.asked, lacking)) if len(lacking) > 1 else []
        if any(w in _WH_WORDS or w in _POLAR_WORDS for w in span[1:-1]):
            lacking = [k for k in lacking if "=" in k] or lacking
        # A narrow group lacking is named as the group: "wireless charging", not "charge wirelessly".
        narrow = [label for k in lacking for label in _labels(k) if label in DECISIVE_GROUPS]
        missing = [need.labels[k] for k in (lacking or asked)] or ["that"]
        topic = narrow[0] if narrow else _span_of(need.asked, lacking) if len(lacking) > 1 else ""
        topic = topic or " ".join(dict.fromkeys(missing[:3]))
        passage_of = {id(p): p for p, _ in eligible}
        on_subject = [p for p in passages if id(p) in passage_of]
        subject = next((p for p in on_subject if p.subject in need.subjects), None) if need.subjects else None
        if subject is not None:
            name = ("the " if subject.mentions_the else "") + subject.subject_name
            text = f"The documents don't say anything about {topic} for {name}."
            on_subject = [p for p in on_subject if p.subject == subject.subject]
        else:
            text = f"The documents don't say anything about {topic}."
        leaves = list(dict.fromkeys(p.heading_leaf.lower() for p in on_subject if p.heading_leaf))
        if leaves and (subject is not None or not need.subjects):
            described = leaves[0] if len(leaves) == 1 else ", ".join(leaves[:-1]) + " and " + leaves[-1]
            if subject is not None:
                owner = name + ("'" if name.endswith("s") else "'s")
                text += f" They describe {owner} {described}."
            else:
                text += f" The passages found are about {described}."
        return text


_MARKUP_RE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>|<[^<>]{0,200}>", re.IGNORECASE | re.DOTALL)


def _without_markup(text: str) -> str:
    """``text`` without HTML tags, and without what a script or style element holds."""
    return _MARKUP_RE.sub(" ", text) if "<" in text else text


def _span_of(text: str, keys: list[str], longest: int = 6) -> str:
    """The words of ``text`` from the first to the last of ``keys`` ("ship to Canada" for the
    keys ship and canada), as the user wrote them; "" when they are not all found close together."""
    tokens = list(_WORD_RE.finditer(text))
    stems = [stem(folded[0]) if (folded := _words(t.group(0))) else "" for t in tokens]
    places = []
    for key in keys:
        word = _word_of(key)
        if not word or word not in stems:
            return ""
        places.append(stems.index(word))
    first, last = min(places), max(places)
    if last - first >= longest:
        return ""
    return text[tokens[first].start():tokens[last].end()]


def _has_other_topic(sentence: Sentence, need: Need, table: SynonymTable) -> bool:
    """A sentence about a discount or trade-in is not a continuation of a price list."""
    return bool(_covers("=discount", sentence.stems, table)) and not any(
        "discount" in _labels(k) for k in need.own)


# Attributes a shop's own pages state for every product (its Returns, Shipping, Repairs
# sections): a question about a product that its passages do not answer may be answered from
# them (AnswerSelector.policy). Not warranty: a product's warranty is its own.
POLICY_GROUPS = frozenset({"return", "shipping", "repair", "condition", "payment", "contact", "availability"})

# Groups a single question word does not add to the search query (see group_names).
_UNEXPANDED_WORD_GROUPS = frozenset({"price", "duration"})


@lru_cache(maxsize=1024)
def _group_names_default(text: str) -> tuple[str, ...]:
    return _group_names(text, default_table())


def asks_only(text: str, groups: frozenset[str], table: SynonymTable) -> bool:
    """Whether every attribute word or phrase of ``text`` that the table knows is in one of
    ``groups`` (and there is one): "Will I get my money back?" asks only of ``POLICY_GROUPS``."""
    asked = [set(_labels(key)) for key, _ in _group_keys(text, table, set()) if not key.startswith("~")]
    asked = [labels for labels in asked if labels]
    return bool(asked) and all(labels & groups for labels in asked)


def group_names(text: str, table: SynonymTable | None = None) -> tuple[str, ...]:
    """The names of the synonym groups that ``text``'s phrases ask about, leaving out those its
    words already spell out ("money back" -> ("return",)). Used by the ``synonyms`` query
    expander, so retrieval reads a question as the answerer does. A single word adds its
    groups too ("fixed" adds "repair", which a Repairs passage shares), except the price group:
    "cost" finds the pricing passages itself, and adding "price" to "How much does shipping
    cost?" pulled every product's Pricing section above the shipping passage; a phrase adds it
    only when it is the one group asked ("What would that set me back?"). ``table`` defaults to
    ``SYNONYMS``."""
    if table is None or table is default_table():
        return _group_names_default(text)
    return _group_names(text, table)


def _group_names(text: str, table: SynonymTable) -> tuple[str, ...]:
    spelled = {stem(w) for w in _words(text)}
    names: list[str] = []
    for key, _label in _group_keys(text, table, set()):
        phrase = key.startswith("=")
        for label in _labels(key):
            if label in names or all(stem(w) in spelled for w in _words(label)) or (
                    not phrase and label in _UNEXPANDED_WORD_GROUPS):
                continue
            names.append(label)
    if len(names) > 1:  # "Do you charge for fixing it?": the repair, not every Pricing section
        names = [n for n in names if n not in _UNEXPANDED_WORD_GROUPS]
    return tuple(names)

