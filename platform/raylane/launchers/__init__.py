"""Launchers turn a lease into Ray work: ``train`` runs a Ray Train gang on it."""
