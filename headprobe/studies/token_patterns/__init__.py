"""Token patterns as declarations: the scorer, tables, rule and console text every declared
pattern analysis shares (`patterns.pattern_analysis`; previous_token, duplicate_token and
induction each declare theirs in their own folder). Registers no analysis itself."""
