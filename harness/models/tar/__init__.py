"""Tar (csuhan/Tar): the AR-DTok bundle loader, the TA-Tok code embedding and the LLM stage."""
