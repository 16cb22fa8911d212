"""Saying it: terminal tables and progress, the HTML report and its charts, the exporters, and
compare/gate in words. Imports every layer below it; nothing imports it but the CLI.
"""
