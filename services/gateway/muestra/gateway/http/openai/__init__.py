"""OpenAI's routes: completions and chat (routes.py, text.py), the Responses API (response_*.py), images
(images.py) and the listings (listings.py)."""
