"""The offline extractive answerer: answer-sentence selection over the retrieved passages.

The ``extractive`` LLM backend (``stages.llms.ExtractiveAnswerer``) runs it; its modules, in the
order a turn uses them: ``vocabulary`` (the language's words and the synonym table, compiled),
``passages`` (the retrieved chunks as scorable sentences), ``question`` (what the question asks)
and ``selector`` (``AnswerSelector``: the answer or a plain decline). Every word list, phrase
pattern and sentence it uses is data: ``django_ragchat/lang/<code>/`` (``django_ragchat.language``).

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

Options (``RAGCHAT["PROFILES"][name]["options"]["extractive"]``): ``min_coverage`` (0.5, the
share of the asked attribute a sentence must state), ``max_sentences`` (4), ``no_answer`` (the
decline used when no passage was given at all). The synonym table is the profile's
``vocabulary`` (``{"synonyms": {"sizes": ["fit", "small", "large"]}}``). See docs/answerer.md.
"""
