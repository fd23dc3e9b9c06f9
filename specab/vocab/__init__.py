"""The vocabulary every part of specab shares: the run's phases and order (``phases``), the engine's log lines, run
ids and the secret rule (``contract``), the engines' spellings and facts (``engines``), the benchmark dataset's record
format (``dataset``). stdlib only (Python >= 3.8), imports nothing else of specab: it is shipped to the node with the node
tools and imported by the controller alike."""
