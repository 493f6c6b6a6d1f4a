"""oncelog's own client side (admin CLI today). Never imports broker/ or storage/."""
