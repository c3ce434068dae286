"""The contract: what an engine author reads and what an engine depends on.

protocol   Engine (describe, run), the features and profiles it may claim, its errors
codec      the JSON every vector and answer is written in, and InputError
plans      the page suite's plan inputs and plans
compare    how answers are compared with expectations (block ids up to renaming)
stdio      kvcert-stdio/1, the same messages for an engine in any language
schema/    vector.schema.json (kvcert-vector/6, reads /1 to /5), stdio.schema.json
           (kvcert-stdio/1)
"""
