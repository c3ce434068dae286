"""SGLang as a conformance engine (`adapter`); it runs in SGLang's own venv."""
