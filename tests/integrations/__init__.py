"""Tests of integrations/: the SillyTavern extension, under node and in SillyTavern itself."""
